"""Test harness: start a real SGLang 0.5.23 server on this CPU (test support code, not product code).

SGLang runs here from the separate venv ``.venv-sglang`` (``make install-sglang``), with
``SGLANG_USE_CPU_ENGINE=1`` and, on the server's ``PYTHONPATH`` only:

* ``site/``: a ``sitecustomize`` that adds TARGET_VERIFY (prefix + tree mask) to SGLang's ``torch_native``
  attention backend, enabled by ``HISTOSPEC_SGLANG_TEST_HARNESS=1``;
* ``stub_kernel/``: the torch stand-in for ``sgl_kernel``, added only when the venv has no real ``sgl_kernel``;
* the checkout itself, so the package under test is the one SGLang's processes import.

Example::

    with SGLangServer(["--model-path", model_dir, "--speculative-algorithm", "HISTOSPEC"]) as server:
        httpx.post(server.url + "/generate", json={"input_ids": [1, 5, 6]})
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parent
REPO_ROOT = HARNESS_DIR.parents[1]
VENV = Path(os.environ.get("HISTOSPEC_SGLANG_VENV", REPO_ROOT / ".venv-sglang"))


def sglang_python() -> Path | None:
    """The harness venv's python, or None when ``make install-sglang`` has not completed."""
    python = VENV / "bin" / "python"
    return python if python.exists() and (VENV / ".installed").exists() else None


def skip_reason() -> str | None:
    """Why SGLang tests cannot run here (None when they can)."""
    if sglang_python() is None:
        return f"{VENV} is missing or incomplete: run `make install-sglang` (CPU SGLang 0.5.23 test harness)"
    return None


def require_harness() -> None:
    """Skip the calling test module when the harness is not installed; under CI (``CI`` set) fail instead."""
    import pytest

    reason = skip_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the SGLang harness first: {reason}")
        pytest.skip(reason)


def tiny_model_dir(directory: Path, vocab_size: int = 64) -> str:
    """The tiny random Llama the SGLang tests serve (seed 0), built in ``directory``."""
    from tests.helpers.tiny import make_tiny_model_dir

    return make_tiny_model_dir(directory, arch="llama", vocab_size=vocab_size, seed=0)


@functools.cache
def has_real_sgl_kernel() -> bool:
    python = sglang_python()
    if python is None:
        return False
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sgl_kernel') else 1)"
    return subprocess.run([str(python), "-c", code], env=_base_env(with_stub=False), timeout=120).returncode == 0


def _base_env(with_stub: bool) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(HARNESS_DIR / "site")]
    if with_stub:
        paths.append(str(HARNESS_DIR / "stub_kernel"))
    paths.append(str(REPO_ROOT))  # the checkout under test, ahead of the one the venv was installed from
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        HISTOSPEC_SGLANG_TEST_HARNESS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(paths),
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def harness_env() -> dict[str, str]:
    """Environment of an SGLang process under the harness (stand-in kernel only without a real one)."""
    return _base_env(with_stub=not has_real_sgl_kernel())


def start_python(code: str) -> subprocess.Popen:
    """Start ``code`` with the harness venv's python and environment (stdout/stderr piped as text)."""
    python = sglang_python()
    if python is None:
        raise RuntimeError(skip_reason())
    return subprocess.Popen(
        [str(python), "-c", code],
        env=harness_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=RUN_DIR,
    )


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` with the harness venv's python and environment; stdout/stderr captured as text."""
    proc = start_python(code)
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# SGLang processes run outside the checkout: with the checkout as the working directory, a stale
# ``sglang_histospec.egg-info`` there (from the main venv's editable install) could hide the harness venv's metadata
# and its ``sglang.srt.plugins`` entry point.
RUN_DIR = Path(tempfile.gettempdir())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Small and CPU-friendly: a tiny KV pool, no CUDA graphs, no warmup request.
CPU_SERVER_ARGS = [
    "--device",
    "cpu",
    "--host",
    "127.0.0.1",
    "--disable-overlap-schedule",
    "--max-total-tokens",
    "8192",
    "--max-running-requests",
    "32",
    "--disable-cuda-graph",
    "--sampling-backend",
    "pytorch",
    "--skip-server-warmup",
    "--dtype",
    "float32",  # SGLang runs float32 checkpoints in float16 by default; exact greedy comparisons need float32
    "--log-level",
    "warning",
]


class SGLangServer:
    """A real SGLang server process (``module`` run with ``-m``) on a free loopback port; a context manager."""

    def __init__(
        self,
        args: list[str],
        module: str = "sglang.launch_server",
        startup_timeout: float = 600,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.module = module
        self.startup_timeout = startup_timeout
        self.extra_env = dict(extra_env or {})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="sglang-server-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None

    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the server process without waiting (several servers can start side by side)."""
        python = sglang_python()
        if python is None:
            raise RuntimeError(skip_reason())
        env = harness_env()
        env.update(self.extra_env)
        cmd = [str(python), "-m", self.module, *self.args, *CPU_SERVER_ARGS, "--port", str(self.port)]
        self._t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=RUN_DIR, start_new_session=True
            )

    def wait_ready(self) -> None:
        """Block until ``/health`` answers 200; raise with the log's tail if the process dies or times out."""
        import httpx

        deadline = self._t0 + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.startup_seconds = time.monotonic() - self._t0
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"SGLang server not ready after {self.startup_timeout} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


__all__ = [
    "SGLangServer",
    "harness_env",
    "run_python",
    "start_python",
    "sglang_python",
    "skip_reason",
    "VENV",
    "REPO_ROOT",
]

if __name__ == "__main__":  # manual use: python -m tests.sglang_harness <sglang server args>
    with SGLangServer(sys.argv[1:]) as srv:
        print(f"ready at {srv.url} in {srv.startup_seconds:.1f} s; log {srv.log_path}; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
