"""Admin side of the real rollout server: auth, weight updates from disk, steps, history snapshots across a
restart, and the ``histospec serve`` command in a subprocess."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from sglang_histospec import cli
from sglang_histospec.server.client import HistoSpecClient, ServerError
from sglang_histospec.server.launch import free_port
from sglang_histospec.server.torch_backend import SNAPSHOT_NAME, TorchBackend, TorchBackendConfig
from tests.helpers.server_harness import ServerThread, shared_tiny_model_dir
from tests.helpers.tiny import make_tiny_model_dir

KEY = "test-admin-key"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return shared_tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory) -> str:
    """Same shapes as ``tiny_model_dir``, other weights."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("other") / "m", arch="llama", vocab_size=64, seed=1)


def _hf_greedy(model_dir: str, prompt: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_admin_routes_need_the_key(tiny_model_dir):
    with ServerThread(tiny_model_dir, admin_api_key=KEY) as srv:
        push = {"step": 0, "entries": [{"prompt_id": "a", "responses": [[4, 5, 6]]}]}
        admin_calls = [
            ("/histospec/history", push),
            ("/histospec/end_step", {"step": None}),
            ("/update_weights_from_disk", {"model_path": tiny_model_dir}),
            ("/flush_cache", None),
        ]
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for path, body in admin_calls:
                r = httpx.post(srv.url + path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert "Authorization" in r.json()["error"]["message"]
        assert srv.client.stats()["history"]["history_tokens"] == 0
        # open routes need no key
        assert httpx.post(srv.url + "/generate", json={"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}})
        for path in ("/health", "/histospec/stats", "/metrics", "/get_model_info"):
            assert httpx.get(srv.url + path).status_code == 200, path
        # the client sends the key
        assert srv.client.push_history(0, push["entries"]) == 1
        srv.client.flush_cache()
        srv.client.end_step(None)
        assert srv.client.stats()["history"]["history_tokens"] > 0
        with pytest.raises(ServerError) as e:
            HistoSpecClient(srv.url).push_history(0, push["entries"])
        assert e.value.status == 401


def test_weight_update_from_disk_then_new_weights(tiny_model_dir, other_model_dir, tmp_path):
    prompt = [1, 8, 9, 10, 11]
    kw = dict(max_new_tokens=8, temperature=0, ignore_eos=True)
    with ServerThread(tiny_model_dir, admin_api_key=KEY) as srv:
        c = srv.client
        assert c.generate([prompt], **kw)[0]["output_ids"] == _hf_greedy(tiny_model_dir, prompt, 8)
        c.push_history(0, [{"prompt_id": "pushed", "responses": [[4, 5, 6, 7]]}])
        c.generate([prompt], prompt_ids=["recorded"], **kw)  # recorded by the server in the open step
        before = c.stats()["history"]
        assert before["siblings"] == 2  # the first request too: no prompt id, so under the id of its tokens
        reply = c.update_weights_from_disk(other_model_dir, weight_version="1")
        assert reply["success"] is True and reply["num_paused_requests"] == 0
        info = c.model_info()
        assert (info["weight_version"], info["model_path"]) == ("1", other_model_dir)
        assert info["tokenizer_path"] == tiny_model_dir  # the tokenizer stays the one the server started with
        out = c.generate([prompt], **kw)[0]
        assert out["output_ids"] == _hf_greedy(other_model_dir, prompt, 8)
        assert out["meta_info"]["weight_version"] == "1"
        after = c.stats()["history"]
        # the history survives; the weight update closed the step, so the recorded response became history
        assert after["prompts"] == before["prompts"] + 2 and after["history_tokens"] > before["history_tokens"]
        # the new step's one sibling is the id-less request just made under the new weights
        assert (after["siblings"], after["open_step"]) == (1, before["open_step"] + 1)
        # a checkpoint with other shapes is refused and the current weights stay
        bad = make_tiny_model_dir(tmp_path / "bad", arch="llama", vocab_size=80, seed=2)
        r = httpx.post(
            srv.url + "/update_weights_from_disk",
            json={"model_path": bad},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 400 and r.json()["success"] is False
        assert c.generate([prompt], **kw)[0]["output_ids"] == out["output_ids"]
        assert c.stats()["history"]["history_tokens"] == after["history_tokens"]


def test_pushed_step_is_not_counted_twice(tiny_model_dir):
    prompt = [1, 8, 9]
    with ServerThread(tiny_model_dir) as srv:
        c = srv.client
        c.update_weights_from_disk(tiny_model_dir, weight_version="7")
        out = c.generate([prompt], prompt_ids=["dd"], max_new_tokens=6, temperature=0, ignore_eos=True)[0]
        assert c.stats()["history"]["siblings"] == 1
        # the trainer pushes the same response for the step it was generated under (weight version 7)
        assert c.push_history(7, [{"prompt_id": "dd", "responses": [out["output_ids"]]}]) == 1
        pushed = c.stats()["history"]["history_tokens"]
        c.update_weights_from_disk(tiny_model_dir, weight_version="8")  # closes step 7: already covered
        assert c.stats()["history"]["history_tokens"] == pushed
        # explicit end_step: recorded responses of a prompt without a push become history
        c.generate([prompt], prompt_ids=["es"], max_new_tokens=6, temperature=0, ignore_eos=True)
        c.end_step(20)
        stats = c.stats()["history"]
        assert stats["history_tokens"] > pushed and stats["open_step"] == 21


def test_history_restored_after_restart(tiny_model_dir, tmp_path):
    hdir = str(tmp_path / "hist")
    prompt = [1, 12, 13, 14]
    with ServerThread(tiny_model_dir, history_dir=hdir, snapshot_debounce_s=0.1) as srv:
        ref = srv.client.generate([prompt], max_new_tokens=16, temperature=0, ignore_eos=True)[0]["output_ids"]
        srv.client.push_history(2, [{"prompt_id": "r", "responses": [ref], "prompt_tokens": prompt}])
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(hdir, SNAPSHOT_NAME)):  # debounced snapshot after the push
            assert time.monotonic() < deadline, "no snapshot after a push"
            time.sleep(0.05)
        srv.client.generate([prompt], prompt_ids=["sib"], max_new_tokens=4, temperature=0)
        saved = srv.client.stats()["history"]
    # draft_selection="always": the restored history must turn into accepted drafts; whether drafting pays at once on
    # a 16-token request is the governor's business (it first times plain steps, then waits for room to probe)
    with ServerThread(tiny_model_dir, history_dir=hdir, draft_selection="always") as srv:
        restored = srv.client.stats()["history"]
        for key in ("prompts", "history_tokens", "open_step", "siblings"):
            assert restored[key] == saved[key], key
        out = srv.client.generate([prompt], prompt_ids=["r"], max_new_tokens=16, temperature=0, ignore_eos=True)[0]
        assert out["output_ids"] == ref
        assert out["meta_info"]["spec_accept_token_num"] > 0
    with open(os.path.join(hdir, SNAPSHOT_NAME), "wb") as f:
        f.write(b"garbage")
    with pytest.raises(ValueError, match="move it away"):
        TorchBackend(TorchBackendConfig(engine=srv.backend.config.engine, history_dir=hdir))


def test_serve_refuses_public_host_without_key_and_unknown_backend(capsys):
    assert cli.main(["serve", "--model", "/nonexistent", "--host", "0.0.0.0"]) == 2
    assert "--admin-api-key" in capsys.readouterr().err
    if importlib.util.find_spec("sglang") is None:
        assert cli.main(["serve", "--model", "/nonexistent", "--backend", "sglang"]) == 2
        assert "make install-sglang" in capsys.readouterr().err
    assert cli.main(["serve", "--model", "/nonexistent", "--dtype-x", "float32"]) == 2
    assert "unrecognized arguments for --backend torch: --dtype-x float32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["trace", "stats", "t.jsonl", "--bogus"])


@pytest.mark.slow  # ~25 s: a fresh interpreter imports torch and transformers
def test_serve_command_in_a_subprocess(tiny_model_dir, tmp_path):
    port = free_port()
    hdir = tmp_path / "h"
    cmd = [sys.executable, "-m", "sglang_histospec.cli", "serve", "--model", tiny_model_dir, "--port", str(port)]
    cmd += ["--history-dir", str(hdir), "--speculative-algorithm", "NONE", "--device", "cpu", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with HistoSpecClient(f"http://127.0.0.1:{port}") as c:
            c.wait_until_ready(timeout=120)
            out = c.generate([[1, 5, 6]], max_new_tokens=3, temperature=0, prompt_ids=["s"])[0]
            assert out["meta_info"]["spec_draft_token_num"] == 0 and len(out["output_ids"]) <= 3
            assert c.push_history(0, [{"prompt_id": "s", "responses": [[5, 6]]}]) == 1
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal (exit status -SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert (hdir / SNAPSHOT_NAME).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_weight_update_waits_for_running_requests(tiny_model_dir, other_model_dir):
    prompt = [1, 20, 21, 22]
    n = 120
    new_ref = _hf_greedy(other_model_dir, prompt, 8)
    with ServerThread(tiny_model_dir) as srv:
        old_ref = srv.client.generate([prompt], max_new_tokens=n, temperature=0, ignore_eos=True)[0]["output_ids"]
        got: list = []
        t = threading.Thread(
            target=lambda: got.append(srv.client.generate([prompt], max_new_tokens=n, temperature=0, ignore_eos=True))
        )
        t.start()
        deadline = time.monotonic() + 30
        while srv.client.stats()["backend"]["engine"]["requests_running"] == 0:
            assert time.monotonic() < deadline and t.is_alive(), "the request never started"
            time.sleep(0.01)
        srv.client.update_weights_from_disk(other_model_dir, weight_version="1")
        assert not t.is_alive(), "the update returned before the running request finished"
        t.join()
        # the request that was running finished entirely on the old weights, the next one runs on the new ones
        assert got[0][0]["output_ids"] == old_ref
        assert (
            srv.client.generate([prompt], max_new_tokens=8, temperature=0, ignore_eos=True)[0]["output_ids"] == new_ref
        )


def _broken_checkpoints(src: str, root) -> dict[str, str]:
    """Checkpoints a weight update must refuse with a 400 (the old weights stay)."""
    import json
    import pickle
    import shutil

    out = {}
    for name in ("pickle-bin", "other-hidden-size", "truncated-safetensors"):
        d = root / name
        shutil.copytree(src, d)
        out[name] = str(d)
    os.remove(os.path.join(out["pickle-bin"], "model.safetensors"))
    with open(os.path.join(out["pickle-bin"], "pytorch_model.bin"), "wb") as f:
        pickle.dump({"not": "a state dict"}, f)
    cfg_path = os.path.join(out["other-hidden-size"], "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["hidden_size"] = 32
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    st = os.path.join(out["truncated-safetensors"], "model.safetensors")
    with open(st, "r+b") as f:
        f.truncate(os.path.getsize(st) // 2)
    return out


def test_unreadable_checkpoints_are_400_and_the_weights_stay(tiny_model_dir, tmp_path):
    prompt = [1, 8, 9, 10]
    kw = dict(max_new_tokens=6, temperature=0, ignore_eos=True)
    with ServerThread(tiny_model_dir, speculative_algorithm="NONE") as srv:
        ref = srv.client.generate([prompt], **kw)[0]["output_ids"]
        for name, path in _broken_checkpoints(tiny_model_dir, tmp_path).items():
            r = httpx.post(srv.url + "/update_weights_from_disk", json={"model_path": path}, timeout=120)
            assert r.status_code == 400, (name, r.text)
            body = r.json()
            assert body["success"] is False and body["error"]["field"] == "model_path", (name, body)
            assert srv.client.generate([prompt], **kw)[0]["output_ids"] == ref, name


def test_error_bodies_name_a_field_and_admin_keys_are_checked():
    from sglang_histospec.server.app import AppConfig

    for key in ("", "   ", " padded "):
        with pytest.raises(ValueError, match="non-blank"):
            AppConfig(admin_api_key=key)
    assert cli.main(["serve", "--model", "/nonexistent", "--admin-api-key", "  "]) == 2


@pytest.mark.parametrize(
    "method, path, body, status, field",
    [
        ("GET", "/nope", None, 404, "path"),
        ("DELETE", "/generate", None, 405, "method"),
        ("POST", "/histospec/history", b"{bad", 401, "Authorization"),
        ("POST", "/flush_cache", None, 401, "Authorization"),
    ],
)
def test_http_errors_name_their_field(tiny_model_dir, method, path, body, status, field):
    with ServerThread(tiny_model_dir, speculative_algorithm="NONE", admin_api_key=KEY) as srv:
        r = httpx.request(method, srv.url + path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
        assert r.json()["error"]["field"] == field, r.text


def test_repeated_push_counts_as_replaced_not_pushed(tiny_model_dir):
    with ServerThread(tiny_model_dir, speculative_algorithm="NONE") as srv:
        entries = [{"prompt_id": "dup", "responses": [[4, 5, 6], [7, 8]]}]
        assert srv.client.push_history(3, entries) == 2
        assert srv.client.push_history(3, entries) == 2  # the same prompt+step again: replaces the first push
        stats = srv.client.stats()
        assert (stats["history_responses_pushed"], stats["history_responses_replaced"]) == (2, 2)


def test_shutdown_signal_answers_running_requests_at_once(tiny_model_dir):
    with ServerThread(tiny_model_dir, speculative_algorithm="NONE") as srv:
        got: list = []
        body = {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}
        t = threading.Thread(target=lambda: got.append(httpx.post(srv.url + "/generate", json=body, timeout=120)))
        t.start()
        deadline = time.monotonic() + 30
        while srv.client.stats()["backend"]["engine"]["requests_running"] == 0:
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
        t0 = time.monotonic()
        srv.backend.begin_shutdown()  # what SIGTERM calls before uvicorn drains the connections
        t.join(30)
        assert time.monotonic() - t0 < 10 and got, "a running request kept the shutdown waiting"
        assert got[0].json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert httpx.get(srv.url + "/health").status_code == 503
        r = httpx.post(srv.url + "/generate", json=body)
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
