"""The rollout server (``histospec serve --backend torch``) in a subprocess, a tiny model and data for TRL tests.

Example::

    with ServerProcess(model_dir) as srv:
        args = HistoSpecGRPOConfig(output_dir=..., rollout_urls=[srv.url], **tiny_grpo_kwargs())
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.launch import free_port

ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "CI": "1"}
os.environ.update(ENV)


class ServerProcess:
    """``histospec serve --backend torch --model DIR`` on a free loopback port; ``url``, ``client``, ``stop()``."""

    def __init__(self, model_dir: str, *, speculative_algorithm: str = "HISTOSPEC", log_path: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "sglang_histospec.cli", "serve", "--backend", "torch", "--model", model_dir,
            "--port", str(self.port), "--device", "cpu", "--speculative-algorithm", speculative_algorithm,
            "--log-level", "warning",
        ]  # fmt: skip
        self._log = open(log_path or os.devnull, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
        root = str(Path(__file__).resolve().parents[1])
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=root)
        self.client = HistoSpecClient(self.url, timeout=300)
        deadline = time.monotonic() + 120
        while not self.client.health():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"rollout server did not start (exit code {self.proc.returncode}); see {log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tiny_dataset(n: int = 4, with_ids: bool = True, id_prefix: str = "q"):
    """``n`` short text prompts with a ``prompt_id`` column ``{id_prefix}0``, ... (none if ``with_ids`` is False).

    Tests sharing one server use distinct prefixes: the drafter keeps one visit per (prompt id, step) and refuses
    a second push for the same pair, as when two runs start from step 0 on one server."""
    from datasets import Dataset

    prompts = [f"what is {i}+{i}?" for i in range(n)]
    data = {"prompt": prompts}
    if with_ids:
        data["prompt_id"] = [f"{id_prefix}{i}" for i in range(n)]
    return Dataset.from_dict(data)


def length_reward(completions, **kwargs):
    """A reward that depends on the completion (so advantages are non-zero)."""
    return [len(c) / 10.0 for c in completions]


def tiny_grpo_kwargs(**overrides):
    """GRPOConfig fields for fast CPU runs (override any)."""
    kw = dict(
        use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4, num_generations=4,
        gradient_accumulation_steps=1, max_completion_length=8, max_steps=2, logging_steps=1,
        gradient_checkpointing=False, save_strategy="no", learning_rate=1e-2, seed=0, disable_tqdm=True,
    )  # fmt: skip
    kw.update(overrides)
    return kw
