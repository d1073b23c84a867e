"""The SGLang path keeps history as durably as ours and applies the same client limits (issue 44), through a real
SGLang 0.5.23 server on CPU (marker ``sglang``; harness: tests/sglang_harness): a push answered 200, kill -9 of
the whole server, a restart on the same ``--histospec-history-dir``, and the push drafts again."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from tests.sglang_harness import SGLangServer, harness_env, sglang_python

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900), pytest.mark.usefixtures("sglang_harness")]

PROMPT = [1, 9, 14, 22, 5, 31]
RESPONSE_LEN = 24


def _server(sglang_model_dir: str, history_dir: str) -> SGLangServer:
    args = [
        "--model-path",
        sglang_model_dir,
        "--speculative-num-draft-tokens",
        "6",
        "--histospec-history-dir",
        history_dir,
    ]
    args += ["--histospec-max-text-chars", "40", "--histospec-max-history-entries", "2"]
    args += ["--histospec-max-request-bytes", "200000"]
    return SGLangServer(args, module="sglang_histospec.server.sglang_backend")


def _generate(server: SGLangServer, prompt_id: str) -> dict:
    params = {"max_new_tokens": RESPONSE_LEN, "temperature": 0.0, "ignore_eos": True}
    params["custom_params"] = {"prompt_id": prompt_id}
    r = httpx.post(server.url + "/generate", json={"input_ids": PROMPT, "sampling_params": params}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def _kill_9(server: SGLangServer) -> None:
    os.killpg(server.proc.pid, signal.SIGKILL)  # the server and its scheduler processes, no shutdown code runs
    server.proc.wait(60)


def test_push_survives_kill_9_and_limits_apply(sglang_model_dir, tmp_path) -> None:
    history_dir = str(tmp_path / "h")
    first = _server(sglang_model_dir, history_dir)
    try:
        first.start()
        reference = _generate(first, "warm-up")["output_ids"]
        body = {"step": 3, "entries": [{"prompt_id": "pushed", "responses": [reference], "rewards": [1.0]}]}
        r = httpx.post(first.url + "/histospec/history", json=body, timeout=120)
        assert r.status_code == 200 and r.json() == {"accepted": 1}, r.text
        # the client limits of our server, on SGLang's
        r = httpx.post(first.url + "/generate", json={"text": "x" * 41}, timeout=60)
        assert r.status_code == 400 and "max_text_chars" in r.json()["error"]["message"], r.text
        too_many = {"step": 3, "entries": [{"prompt_id": f"e{i}", "responses": [[5]]} for i in range(3)]}
        r = httpx.post(first.url + "/histospec/history", json=too_many, timeout=60)
        assert r.status_code == 400 and "max_history_entries" in r.text, r.text
        r = httpx.post(first.url + "/generate", json={"input_ids": [1] * 100_000}, timeout=60)
        assert r.status_code == 413, r.text
        _kill_9(first)
    finally:
        first.stop()
    assert os.path.getsize(os.path.join(history_dir, "history.wal")) > 8  # the push is in the log

    second = _server(sglang_model_dir, history_dir)
    try:
        second.start()
        stats = httpx.get(second.url + "/histospec/stats", timeout=120).json()["history"]
        assert stats["prompts"] >= 1, stats
        out = _generate(second, "pushed")
        assert out["output_ids"] == reference
        assert out["meta_info"]["spec_accept_length"] > 2.0  # drafted from the push made before kill -9
    finally:
        second.stop()


def test_corrupt_history_refuses_the_start_with_exit_2(sglang_model_dir, tmp_path) -> None:
    """The check runs before SGLang loads anything: exit 2 naming the file, the offset and the repair command."""
    history_dir = tmp_path / "h"
    history_dir.mkdir()
    (history_dir / "history.wal").write_bytes(b"HSPWAL\x00\x02" + b"\x05" * 40)
    cmd = [str(sglang_python()), "-m", "sglang_histospec.server.sglang_backend", "--model-path", sglang_model_dir]
    cmd += ["--histospec-history-dir", str(history_dir)]
    done = subprocess.run(cmd, env=harness_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "history.wal" in done.stderr and "--drop-from 8" in done.stderr
