"""Start the real rollout server (torch backend, uvicorn) in a thread on a free loopback port, for tests.

Example::

    with ServerThread(model_dir, speculative_algorithm="NONE") as srv:
        HistoSpecClient(srv.url).generate([[1, 5, 6]], max_new_tokens=4)
"""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn

from sglang_histospec.engine.types import EngineConfig
from sglang_histospec.server.app import AppConfig, create_app
from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.launch import free_port
from sglang_histospec.server.schemas import RequestLimits
from sglang_histospec.server.torch_backend import TorchBackend, TorchBackendConfig
from tests.helpers.tiny import make_tiny_model_dir


class ServerThread:
    """A live server; ``url``, ``client`` (admin key included), ``backend``; ``stop()`` shuts it down cleanly."""

    def __init__(
        self,
        model_dir: str,
        *,
        speculative_algorithm: str = "HISTOSPEC",
        admin_api_key: str | None = None,
        history_dir: str | None = None,
        max_request_bytes: int = 64 * 2**20,
        snapshot_debounce_s: float = 0.2,
        limits: RequestLimits | None = None,
        port: int | None = None,
        **engine_kwargs,
    ) -> None:
        engine_cfg = EngineConfig(
            model_path=model_dir, device="cpu", speculative_algorithm=speculative_algorithm, **engine_kwargs
        )
        self.backend = TorchBackend(
            TorchBackendConfig(engine=engine_cfg, history_dir=history_dir, snapshot_debounce_s=snapshot_debounce_s)
        )
        self.app = create_app(
            self.backend,
            AppConfig(
                admin_api_key=admin_api_key, max_request_bytes=max_request_bytes, limits=limits or RequestLimits()
            ),
        )
        port = port or free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        self.client = HistoSpecClient(self.url, admin_api_key=admin_api_key, timeout=120)

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(60)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_SHARED_MODEL: dict[str, str] = {}

LONG_RUN_TOKENS = 4000
"""``max_new_tokens`` of a request that runs for seconds on :func:`long_context_model_dir`'s model, so a test's
disconnect, abort or shutdown always lands while it runs (a few hundred tokens of the tiny model can finish first)."""


def shared_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tiny Llama (vocab 64, char tokenizer, seed 0) built once per session for every server test module."""
    if "path" not in _SHARED_MODEL:
        path = tmp_path_factory.mktemp("server-tiny") / "m"
        _SHARED_MODEL["path"] = make_tiny_model_dir(path, arch="llama", vocab_size=64, seed=0)
    return _SHARED_MODEL["path"]


def long_context_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shared tiny Llama's twin with 8192 positions: room for :data:`LONG_RUN_TOKENS`-token requests."""
    if "long" not in _SHARED_MODEL:
        path = tmp_path_factory.mktemp("server-tiny-long") / "m"
        _SHARED_MODEL["long"] = make_tiny_model_dir(
            path, arch="llama", vocab_size=64, seed=0, max_position_embeddings=2 * LONG_RUN_TOKENS
        )
    return _SHARED_MODEL["long"]
