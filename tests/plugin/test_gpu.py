"""HISTOSPEC in SGLang on a CUDA GPU (marker ``gpu``; skipped on machines without one, i.e. everywhere in CI here).

This is the run the CPU harness cannot do: SGLang's own CUDA kernels (flashinfer/triton tree attention, CUDA graphs,
the sampling verify kernel ``tree_speculative_sampling_target_only`` at T > 0). It needs ``sglang==0.5.23`` installed
normally (with its CUDA dependencies) in this interpreter's environment, plus this package.

    pytest -m gpu tests/plugin/test_gpu.py
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if not _cuda_available() or importlib.util.find_spec("sglang") is None:
    pytest.skip("needs a CUDA GPU and sglang==0.5.23 installed in this environment", allow_module_level=True)


class _Server:
    def __init__(self, args: list[str], module: str) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="sglang-gpu-", suffix=".log")[1])
        cmd = [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-4000:]
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise TimeoutError(self.log.read_text(errors="replace")[-4000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.helpers.tiny import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("gpu-model"), arch="llama", vocab_size=64, seed=0)


def _generate(url, prompts, ids, temperature):
    params = [
        {"max_new_tokens": 48, "temperature": temperature, "ignore_eos": True, "custom_params": {"prompt_id": i}}
        for i in ids
    ]
    r = httpx.post(url + "/generate", json={"input_ids": prompts, "sampling_params": params}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def test_histospec_on_gpu_matches_greedy_and_samples(model_dir):
    prompts = [[1, 5 + i, 9, 12 + i % 7, 30] for i in range(16)]
    ids = [f"g{i}" for i in range(16)]
    common = ["--model-path", model_dir, "--dtype", "float32", "--max-total-tokens", "16384"]
    ref = _Server(common, "sglang.launch_server")
    try:
        ref.wait()
        reference = [o["output_ids"] for o in _generate(ref.url, prompts, ids, 0.0)]
    finally:
        ref.stop()
    hs = _Server([*common, "--speculative-num-draft-tokens", "8"], "sglang_histospec.server.sglang_backend")
    try:
        hs.wait()
        assert [o["output_ids"] for o in _generate(hs.url, prompts, ids, 0.0)] == reference
        assert httpx.post(hs.url + "/flush_cache", timeout=120).status_code == 200
        second = _generate(hs.url, prompts, ids, 0.0)
        assert [o["output_ids"] for o in second] == reference
        assert min(o["meta_info"]["spec_accept_length"] for o in second) > 2.0
        sampled = _generate(hs.url, prompts, ids, 1.0)  # SGLang's sampling verify kernel with history drafts
        assert all(len(o["output_ids"]) == 48 for o in sampled)
        assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in sampled)
    finally:
        hs.stop()
