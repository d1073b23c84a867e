"""The HistoPipe router's logic (no HTTP server here; ``router/app.py`` puts routes on it).

It holds one connection per rollout server (backend), their health, a :class:`LengthPredictor` fed by every
response and history push, and a :class:`Planner`. A step (``run_step``) is planned across the healthy backends
and dispatched as one batched ``/generate`` per backend, in parallel. A backend whose call fails (connection
error, timeout or 5xx) is marked down and the requests of that call are resubmitted to the other healthy
backends (least predicted work first): a batched call returns all its answers or none, so every request is
answered exactly once. Plain ``/generate`` bodies are split per item and placed per prompt on the backend with
the least outstanding predicted work. Not done here: migrating a running outlier (needs streaming/abort between
backends); the simulator models it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglang_histospec.core.costmodel import CostModel
from sglang_histospec.core.lengths import LengthPredictor, LengthPredictorConfig
from sglang_histospec.core.planner import POLICIES, Group, Planner, PlannerConfig
from sglang_histospec.server.client import HistoSpecClient, ServerError

PER_ITEM_KEYS = (
    "input_ids",
    "text",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
)
"""Fields of a batched SGLang /generate body that may hold one value per item."""


class RouterError(RuntimeError):
    """A request the router cannot serve: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class RouterConfig:
    backends: list[str]
    """Base URLs of the rollout servers (``histospec serve``)."""
    policy: str = "histopipe"
    """Placement policy of a step: one of ``POLICIES``."""
    admin_api_key: str | None = None
    """Sent to the backends' admin routes; when set the router's own admin routes require it too."""
    health_interval_s: float = 2.0
    """Seconds between health checks of every backend."""
    request_timeout_s: float = 600.0
    """A backend call taking longer counts as a failure (its requests are resubmitted)."""
    max_attempts: int = 3
    """A request is tried on at most this many backends."""

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("RouterConfig.backends is empty: give at least one rollout server URL")
        if self.policy not in POLICIES:
            raise ValueError(f"RouterConfig.policy={self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.max_attempts < 1:
            raise ValueError(f"RouterConfig.max_attempts={self.max_attempts!r}: must be >= 1")


@dataclass(slots=True)
class Backend:
    url: str
    client: HistoSpecClient
    http: httpx.Client
    healthy: bool = True
    outstanding: float = 0.0  # predicted tokens of requests in flight
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n


class _BackendDown(Exception):
    pass


class Router:
    """Example::

    router = Router(RouterConfig(backends=["http://127.0.0.1:30001", "http://127.0.0.1:30002"]))
    results = router.run_step(0, [("p0", [1, 5, 7]), ("p1", [1, 9])], group_size=4,
                              sampling_params={"max_new_tokens": 32, "temperature": 1.0})
    len(results)  # 8: prompt i, sample j at index i * 4 + j
    """

    def __init__(self, config: RouterConfig, cost: CostModel | None = None) -> None:
        self.config = config
        headers = {"Authorization": f"Bearer {config.admin_api_key}"} if config.admin_api_key else {}
        self.backends = [
            Backend(
                url.rstrip("/"),
                HistoSpecClient(url, admin_api_key=config.admin_api_key, timeout=config.request_timeout_s),
                httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=config.request_timeout_s),
            )
            for url in config.backends
        ]
        self.predictor = LengthPredictor(LengthPredictorConfig(window=2))
        self.planner = Planner(cost or CostModel(), PlannerConfig(policy=config.policy))
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(self.backends)), thread_name_prefix="router")
        self._stop = threading.Event()
        self._health_thread: threading.Thread | None = None
        self.steps = 0

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.check_health()
        self._health_thread = threading.Thread(target=self._health_loop, name="router-health", daemon=True)
        self._health_thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._health_thread is not None:
            self._health_thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for b in self.backends:
            b.client.close()
            b.http.close()

    def _health_loop(self) -> None:
        while not self._stop.wait(self.config.health_interval_s):
            self.check_health()

    def check_health(self) -> list[bool]:
        for b in self.backends:
            b.healthy = b.client.health()
        return [b.healthy for b in self.backends]

    def healthy(self) -> list[Backend]:
        return [b for b in self.backends if b.healthy]

    # ---- a whole step ------------------------------------------------------------------------------------
    def run_step(
        self,
        step: int,
        prompts: Sequence[tuple[str, list[int]]],
        group_size: int,
        sampling_params: dict[str, Any] | None = None,
        return_logprob: bool = False,
    ) -> list[dict[str, Any]]:
        """Generate ``group_size`` samples of every prompt; answers in request order (prompt i, sample j at i*G+j).

        Each answer is the backend's SGLang item plus ``meta_info.histopipe`` = ``{"backend", "attempts"}``.
        """
        if not isinstance(group_size, int) or group_size < 1:
            raise RouterError(400, f"group_size={group_size!r}: must be an int >= 1")
        if not prompts:
            raise RouterError(400, "prompts is empty")
        live = self.healthy()
        if not live:
            raise RouterError(503, "no healthy backend")
        groups = [Group(pid, group_size, len(ids)) for pid, ids in prompts]
        with self._lock:
            plan = self.planner.plan(step, groups, len(live), self.predictor)
        items: list[dict[str, Any]] = []
        for pid, ids in prompts:
            for _ in range(group_size):
                sp = dict(sampling_params or {})
                sp["custom_params"] = {**sp.get("custom_params", {}), "prompt_id": pid}
                items.append({"input_ids": list(ids), "sampling_params": sp, "return_logprob": return_logprob})
        placement = {
            self.backends.index(live[w]): [g * group_size + s for g, s in reqs] for w, reqs in enumerate(plan.workers)
        }
        predicted = [plan.predicted_lengths[i // group_size] for i in range(len(items))]
        results = self._dispatch(items, placement, predicted)
        with self._lock:
            for i, out in enumerate(results):
                pid = prompts[i // group_size][0]
                self.predictor.observe(pid, max(0, step), _completion_tokens(out))
            self.steps += 1
        return results

    # ---- plain /generate ---------------------------------------------------------------------------------
    def generate(self, body: dict[str, Any]) -> Any:
        """Forward an SGLang /generate body; batch bodies are split per item and placed per prompt."""
        items, batch = split_generate_body(body)
        predicted = []
        for item in items:
            pid = (item.get("sampling_params") or {}).get("custom_params", {}).get("prompt_id")
            predicted.append(self.predictor.predict(pid).mean if isinstance(pid, str) else self.predictor.prior().mean)
        placement: dict[int, list[int]] = {}
        with self._lock:
            live = self.healthy()
            if not live:
                raise RouterError(503, "no healthy backend")
            load = {self.backends.index(b): b.outstanding for b in live}
            for i in sorted(range(len(items)), key=lambda i: -predicted[i]):
                target = min(load, key=lambda k: (load[k], k))
                placement.setdefault(target, []).append(i)
                load[target] += predicted[i]
        results = self._dispatch(items, placement, predicted)
        with self._lock:
            for item, out in zip(items, results):
                pid = (item.get("sampling_params") or {}).get("custom_params", {}).get("prompt_id")
                if isinstance(pid, str):
                    self.predictor.observe(pid, self.steps, _completion_tokens(out))
        return results if batch else results[0]

    # ---- history and admin fan-out -----------------------------------------------------------------------
    def push_history(self, step: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Send a history push to every healthy backend; the lengths feed the predictor."""
        with self._lock:
            for e in entries:
                lengths = [len(r) for r in e.get("responses", []) if isinstance(r, list)]
                if isinstance(e.get("prompt_id"), str) and lengths:
                    self.predictor.add(e["prompt_id"], int(step), lengths)
        return self._fan_out(lambda b: b.client.push_history(step, entries), "accepted")

    def end_step(self, step: int | None) -> dict[str, Any]:
        return self._fan_out(lambda b: (b.client.end_step(step), 1)[1], "success")

    def _fan_out(self, call, key: str) -> dict[str, Any]:  # noqa: ANN001
        live = self.healthy()
        if not live:
            raise RouterError(503, "no healthy backend")
        futures = {self._pool.submit(call, b): b for b in live}
        per_backend: dict[str, Any] = {}
        for fut, b in futures.items():
            try:
                per_backend[b.url] = fut.result()
                b.count("fan_out_ok")
            except ServerError as exc:
                if exc.status < 500:
                    raise RouterError(exc.status, f"{b.url}: {exc.message}") from exc
                self._down(b)
                per_backend[b.url] = None
            except httpx.HTTPError:
                self._down(b)
                per_backend[b.url] = None
        done = [v for v in per_backend.values() if v is not None]
        if not done:
            raise RouterError(503, "every backend failed")
        value = min(done) if key == "accepted" else True
        return {key: value, "backends": per_backend}

    # ---- dispatch ----------------------------------------------------------------------------------------
    def _dispatch(
        self, items: list[dict[str, Any]], placement: dict[int, list[int]], predicted: list[float]
    ) -> list[dict[str, Any]]:
        """Run ``placement`` (backend index -> item indices); resubmit the items of failed calls elsewhere."""
        results: list[dict[str, Any] | None] = [None] * len(items)
        attempts = [0] * len(items)
        running: dict[Future, tuple[int, list[int]]] = {}

        def submit(b: int, idx: list[int]) -> None:
            backend = self.backends[b]
            with self._lock:
                backend.outstanding += sum(predicted[i] for i in idx)
            for i in idx:
                attempts[i] += 1
            running[self._pool.submit(self._post, backend, [items[i] for i in idx])] = (b, idx)

        for b, idx in placement.items():
            if idx:
                submit(b, idx)
        while running:
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                b, idx = running.pop(fut)
                backend = self.backends[b]
                with self._lock:
                    backend.outstanding -= sum(predicted[i] for i in idx)
                try:
                    outs = fut.result()
                except _BackendDown:
                    self._down(backend)
                    backend.count("failed_requests", len(idx))
                    self._resubmit(idx, attempts, predicted, submit, exclude=b)
                    continue
                for i, out in zip(idx, outs):
                    assert results[i] is None, "a request was answered twice"
                    meta = out.setdefault("meta_info", {})
                    meta["histopipe"] = {"backend": backend.url, "attempts": attempts[i]}
                    results[i] = out
                backend.count("requests", len(idx))
                backend.count("completion_tokens", sum(_completion_tokens(o) for o in outs))
        assert all(r is not None for r in results), "a request was lost"
        return results  # type: ignore[return-value]

    def _resubmit(self, idx: list[int], attempts: list[int], predicted: list[float], submit, exclude: int) -> None:  # noqa: ANN001
        over = [i for i in idx if attempts[i] >= self.config.max_attempts]
        if over:
            raise RouterError(503, f"requests {over[:5]} failed on {self.config.max_attempts} backends")
        with self._lock:
            live = [self.backends.index(b) for b in self.healthy() if self.backends.index(b) != exclude]
            if not live:
                raise RouterError(503, "every backend failed during the step")
            load = {b: self.backends[b].outstanding for b in live}
            moved: dict[int, list[int]] = {}
            for i in sorted(idx, key=lambda i: -predicted[i]):
                target = min(load, key=lambda k: (load[k], k))
                moved.setdefault(target, []).append(i)
                load[target] += predicted[i]
        for b, chunk in moved.items():
            self.backends[b].count("resubmitted_in", len(chunk))
            submit(b, chunk)

    def _post(self, backend: Backend, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        body = join_generate_items(items)
        try:
            response = backend.http.post("/generate", json=body)
        except httpx.HTTPError as exc:
            raise _BackendDown(str(exc)) from exc
        if response.status_code >= 500:
            raise _BackendDown(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise RouterError(response.status_code, f"{backend.url}: {response.text}")
        out = response.json()
        return out if isinstance(out, list) else [out]

    def _down(self, backend: Backend) -> None:
        backend.healthy = False
        backend.count("failures")

    # ---- observability -----------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy,
            "steps": self.steps,
            "prompts_with_history": len(self.predictor),
            "backends": [
                {"url": b.url, "healthy": b.healthy, "outstanding_tokens": b.outstanding, **b.counters}
                for b in self.backends
            ],
        }

    def metrics_text(self) -> str:
        lines = [
            "# TYPE histopipe_backend_healthy gauge",
            *(f'histopipe_backend_healthy{{backend="{b.url}"}} {int(b.healthy)}' for b in self.backends),
        ]
        for name in ("requests", "completion_tokens", "failures", "failed_requests", "resubmitted_in"):
            lines.append(f"# TYPE histopipe_backend_{name}_total counter")
            lines += [
                f'histopipe_backend_{name}_total{{backend="{b.url}"}} {b.counters.get(name, 0)}' for b in self.backends
            ]
        lines += ["# TYPE histopipe_steps_total counter", f"histopipe_steps_total {self.steps}"]
        return "\n".join(lines) + "\n"


def _completion_tokens(out: dict[str, Any]) -> int:
    meta = out.get("meta_info") or {}
    n = meta.get("completion_tokens")
    return int(n) if isinstance(n, int) else len(out.get("output_ids") or [])


def split_generate_body(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Split an SGLang /generate body into single-item bodies; returns (items, was_batch).

    Example: ``{"input_ids": [[1], [2]], "sampling_params": {"max_new_tokens": 4}}`` gives two items with the
    same sampling params and ``True``.
    """
    if not isinstance(body, dict):
        raise RouterError(400, "the /generate body must be a JSON object")
    if isinstance(body.get("input_ids"), list) and body["input_ids"] and isinstance(body["input_ids"][0], list):
        n, key = len(body["input_ids"]), "input_ids"
    elif isinstance(body.get("text"), list):
        n, key = len(body["text"]), "text"
    elif "input_ids" in body or "text" in body:
        return [dict(body)], False
    else:
        raise RouterError(400, "the /generate body needs 'input_ids' or 'text'")
    if n == 0:
        raise RouterError(400, f"'{key}' is an empty batch")
    for k, v in body.items():
        if k != key and k in PER_ITEM_KEYS and isinstance(v, list) and len(v) != n:
            raise RouterError(400, f"'{k}' has {len(v)} items for a batch of {n}")
    items = []
    for i in range(n):
        per_item = {k: v[i] for k, v in body.items() if k == key or (k in PER_ITEM_KEYS and isinstance(v, list))}
        items.append({**body, **per_item})
    return items, True


def join_generate_items(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The inverse of :func:`split_generate_body`: one batched body (every field per item)."""
    keys: list[str] = []
    for item in items:
        keys += [k for k in item if k not in keys]
    body: dict[str, Any] = {}
    for k in keys:
        values = [item.get(k) for item in items]
        if k in ("input_ids", "text", "sampling_params", "rid") or (
            k in PER_ITEM_KEYS and any(v != values[0] for v in values)
        ):
            body[k] = values
        elif any(v != values[0] for v in values):
            raise RouterError(400, f"field {k!r} differs between the items of one backend call")
        else:
            body[k] = values[0]
    if "input_ids" not in body and "text" not in body:
        raise RouterError(400, "items need 'input_ids' or 'text'")
    return body


def wait_for_backends(router: Router, timeout: float = 60.0) -> None:
    """Block until every backend answers /health (for scripts and tests)."""
    deadline = time.monotonic() + timeout
    while not all(router.check_health()):
        if time.monotonic() > deadline:
            down = [b.url for b in router.backends if not b.healthy]
            raise TimeoutError(f"backends not ready after {timeout} s: {down}")
        time.sleep(0.2)
