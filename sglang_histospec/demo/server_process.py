"""``histospec serve --backend torch`` in a subprocess on a free loopback port, for the demo's GRPO runs.

Example::

    with RolloutServerProcess(model_dir, "HISTOSPEC", log_path="server.log") as srv:
        srv.url        # http://127.0.0.1:PORT, for HistoSpecGRPOConfig(rollout_urls=[srv.url])
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.launch import free_port


class RolloutServerProcess:
    """A rollout server subprocess (torch backend, CPU, one intra-op thread); ``url``, ``client``, ``stop()``.

    ``extra_args`` are appended to the ``histospec serve`` command line (e.g. ``["--draft-selection", "always"]``)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        speculative_algorithm: str = "HISTOSPEC",
        log_path: str | os.PathLike | None = None,
        seed: int = 0,
        ready_timeout: float = 300.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        if speculative_algorithm not in ("HISTOSPEC", "NONE"):
            raise ValueError(f"speculative_algorithm={speculative_algorithm!r}: use 'HISTOSPEC' or 'NONE'")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "sglang_histospec.cli", "serve", "--backend", "torch", "--model", str(model_dir),
            "--port", str(self.port), "--device", "cpu", "--speculative-algorithm", speculative_algorithm,
            "--seed", str(seed), "--log-level", "warning", *extra_args,
        ]  # fmt: skip
        self._log = open(log_path or os.devnull, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.client = HistoSpecClient(self.url, timeout=600)
        deadline = time.monotonic() + ready_timeout
        while not self.client.health():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"rollout server ({speculative_algorithm}) did not start (exit code {self.proc.returncode}); "
                    f"see {log_path or 'its log (pass log_path)'}"
                )
            time.sleep(0.25)

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 30 s) and close its log."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> RolloutServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
