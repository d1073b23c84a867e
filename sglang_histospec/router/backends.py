"""The router's rollout servers (:class:`BackendPool`): one connection each, their health, bringing one back (the
last weight update, then the kept history pushes: ``router/recovery.py``), fan-out of admin calls to every healthy
one, and the single ``/generate`` and ``/abort_request`` calls the dispatchers make. Example: :class:`BackendPool`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglang_histospec.router.config import RouterConfig, RouterError
from sglang_histospec.router.items import dumps, join_generate_items
from sglang_histospec.router.recovery import PushLog, health_answer, replay_pushes
from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.http_api import ApiError


@dataclass(slots=True)
class Backend:
    url: str
    client: HistoSpecClient
    http: httpx.Client
    healthy: bool = True
    outstanding: float = 0.0  # predicted tokens of requests in flight
    problem: str | None = None  # why it is out (failed health check, replay), for /health
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n


class BackendDown(Exception):
    """A backend call failed (connection error, timeout, 5xx, or the client closed at shutdown)."""


def error_of(response: httpx.Response) -> ApiError:
    """The backend's error answer as an ApiError (its message and field, unchanged)."""
    message, fld = response.text[:2000], None
    try:
        payload = response.json()
    except ValueError:
        payload = None
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        message, fld = str(err.get("message", message)), err.get("field")
    return ApiError(response.status_code, message, fld if isinstance(fld, str) else None)


class BackendPool:
    """The rollout servers of one router and their health. Example::

        pool = BackendPool(RouterConfig(backends=["http://127.0.0.1:30001"]))
        pool.check_health()            # [True] once the server answers /health
        pool.fan_out("/histospec/end_step", {"step": 3})   # {url: answer} of every healthy backend

    A backend whose call fails is marked down (:meth:`down`) and comes back once its health check passes and it
    took the last weight update and the kept history pushes (:meth:`check_health`). :meth:`live` raises a 503
    while shutting down or when none is healthy.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        headers = {"Content-Type": "application/json"}
        if config.admin_api_key:
            headers["Authorization"] = f"Bearer {config.admin_api_key}"
        self._headers = headers
        self.backends = [self._connect(url) for url in config.backends]
        self.pushes = PushLog(config.replay_steps, config.replay_max_bytes)
        self.push_lock = threading.Lock()  # a push fans out, or a backend is brought back, never both at once
        self.stop = threading.Event()
        self.weights: dict[str, Any] | None = None  # the last weight update every backend took
        self._pool = ThreadPoolExecutor(max_workers=max(8, 4 * len(self.backends)), thread_name_prefix="router")
        self._health_thread: threading.Thread | None = None

    def _connect(self, url: str) -> Backend:
        timeout = self.config.request_timeout_s
        return Backend(
            url.rstrip("/"),
            HistoSpecClient(url, admin_api_key=self.config.admin_api_key, timeout=timeout),
            httpx.Client(base_url=url.rstrip("/"), headers=self._headers, timeout=timeout),
        )

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the pool's threads (a future)."""
        return self._pool.submit(fn, *args, **kwargs)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.check_health()
        self._health_thread = threading.Thread(target=self._health_loop, name="router-health", daemon=True)
        self._health_thread.start()

    def begin_shutdown(self) -> None:
        """Stop taking requests and fail the running backend calls now."""
        self.stop.set()
        for b in self.backends:
            b.http.close()

    def close(self) -> None:
        self.stop.set()
        if self._health_thread is not None:
            self._health_thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for b in self.backends:
            b.client.close()
            b.http.close()

    def _health_loop(self) -> None:
        while not self.stop.wait(self.config.health_interval_s):
            self.check_health()

    # ---- health ------------------------------------------------------------------------------------------
    def check_health(self) -> list[bool]:
        for b in list(self.backends):
            up = b.client.health()
            if not up:
                b.healthy, b.problem = False, "health check failed"
            elif not b.healthy:
                self._bring_back(b)
        return [b.healthy for b in self.backends]

    def _bring_back(self, backend: Backend) -> None:
        """A backend that answers again (restarted, or added) first loads the weights the others hold and gets
        the kept history pushes; only then is it healthy (routed to)."""
        if self.weights is not None and not self._resync_weights(backend):
            backend.problem = "weight resync failed"
            return
        with self.push_lock:
            bodies = self.pushes.bodies()
            backend.problem = replay_pushes(backend.http, bodies)
            if backend.problem is not None:
                return
            backend.healthy = True
        if bodies:
            backend.count("history_replays")
            backend.count("replayed_pushes", len(bodies))

    def _resync_weights(self, backend: Backend) -> bool:
        """A backend that comes back (e.g. restarted) first loads the weights the others hold."""
        try:
            response = backend.http.post("/update_weights_from_disk", content=dumps(self.weights))
        except httpx.HTTPError:
            return False
        backend.count("weight_resyncs")
        return response.status_code == 200

    def add(self, url: str) -> dict[str, Any]:
        """Add a rollout server; it is routed to once it answers /health and got the kept pushes (``check_health``
        runs now and every ``health_interval_s``). ValueError for a URL already there or not http(s)."""
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url={url!r}: expected http://host:port")
        if any(b.url == url for b in self.backends):
            raise ValueError(f"url={url!r}: already a backend of this router")
        backend = self._connect(url)
        backend.healthy, backend.problem = False, "added, not checked yet"
        self.backends.append(backend)
        self.check_health()
        return {"url": url, "healthy": backend.healthy, "problem": backend.problem}

    def health(self) -> tuple[int, dict[str, Any]]:
        """(status, body) of ``GET /health`` (``recovery.health_answer``)."""
        backends = [{"url": b.url, "healthy": b.healthy, "problem": b.problem} for b in self.backends]
        return health_answer(backends, self.pushes.stats())

    def healthy(self) -> list[Backend]:
        return [b for b in self.backends if b.healthy]

    def live(self) -> list[Backend]:
        """The healthy backends; a 503 while shutting down or when none is healthy."""
        if self.stop.is_set():
            raise RouterError(503, "the router is shutting down")
        live = self.healthy()
        if not live:
            raise RouterError(503, "no healthy backend")
        return live

    def down(self, backend: Backend) -> None:
        backend.healthy, backend.problem = False, "a call failed; back once its health check passes"
        backend.count("failures")

    # ---- calls -------------------------------------------------------------------------------------------
    def post_generate(self, backend: Backend, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One batched ``/generate`` of ``items`` on ``backend``: its answers, :class:`BackendDown` on a failure,
        the backend's 4xx as an ApiError."""
        body = join_generate_items(items)
        try:
            response = backend.http.post("/generate", content=dumps(body))
        except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: the client was closed at shutdown
            raise BackendDown(str(exc)) from exc
        if response.status_code >= 500:
            raise BackendDown(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise error_of(response)
        out = response.json()
        return out if isinstance(out, list) else [out]

    def abort_one(self, backend: Backend, rid: str) -> bool:
        """SGLang's abort route on ``backend``; False when the backend did not take it."""
        try:
            response = backend.http.post("/abort_request", content=dumps({"rid": rid}), timeout=10.0)
        except (httpx.HTTPError, RuntimeError):  # RuntimeError: the client was closed at shutdown
            return False
        return response.status_code < 400

    def abort_everywhere(self, rids: list[str]) -> None:
        """Abort ``rids`` on every healthy backend; best effort."""
        for b in self.healthy():
            try:
                b.http.post("/abort_request", content=dumps({"rid": rids}), timeout=5.0)
            except httpx.HTTPError:
                continue

    def get(self, path: str) -> Any:
        """GET ``path`` from a healthy backend (model info: every backend serves the same model)."""
        for b in self.live():
            try:
                response = b.http.get(path, timeout=30.0)
            except httpx.HTTPError:
                self.down(b)
                continue
            if response.status_code >= 400:
                raise error_of(response)
            return response.json()
        raise RouterError(503, "every backend failed")

    def fan_out(self, path: str, body: Any, parse: bool = True) -> dict[str, Any]:
        """POST to every healthy backend in parallel. A 4xx from any backend is the answer (the same for all:
        they serve the same model); a backend that fails otherwise is marked down; at least one must succeed."""
        live = self.live()
        content = body if isinstance(body, bytes) else b"" if body is None else dumps(body)
        futures = {self._pool.submit(b.http.post, path, content=content): b for b in live}
        per_backend: dict[str, Any] = {}
        refused: ApiError | None = None
        for fut, b in futures.items():
            try:
                response = fut.result()
            except httpx.HTTPError as exc:
                self.down(b)
                per_backend[b.url] = {"error": {"message": f"{type(exc).__name__}: {exc}"}}
                continue
            if response.status_code >= 400:
                err = error_of(response)
                if response.status_code < 500:
                    refused = refused or err
                else:
                    self.down(b)
                per_backend[b.url] = {"error": {"message": err.message}}
                continue
            b.count("fan_out_ok")
            per_backend[b.url] = response.json() if parse else response.text
        if refused is not None:
            raise refused
        if not any(not (isinstance(v, dict) and "error" in v) for v in per_backend.values()):
            detail = "; ".join(f"{u}: {v['error']['message']}" for u, v in per_backend.items())
            raise RouterError(503, f"every backend failed ({detail})")
        return per_backend
