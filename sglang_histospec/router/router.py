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

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglang_histospec.core.costmodel import CostModel
from sglang_histospec.core.lengths import LengthPredictor, LengthPredictorConfig
from sglang_histospec.core.planner import POLICIES, Group, Planner, PlannerConfig
from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.http_api import ApiError, check_admin_key
from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import (
    GenerateBody,
    HistoryPushBody,
    RequestLimits,
    StepBody,
    check_generate_body,
    item_rids,
    sample_rid,
    step_to_generate_body,
    to_generation_inputs,
    to_history_entries,
)

logger = logging.getLogger(__name__)

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


class RouterError(ApiError):
    """A request the router cannot serve: ``status`` is the HTTP status to answer with (shared error format)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(status, message, field)


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
    limits: RequestLimits = field(default_factory=RequestLimits)
    """The same client limits as a server's (checked before anything is forwarded)."""
    max_request_bytes: int = 64 * 2**20
    """Larger request bodies get HTTP 413."""

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("RouterConfig.backends is empty: give at least one rollout server URL")
        if self.policy not in POLICIES:
            raise ValueError(f"RouterConfig.policy={self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.max_attempts < 1:
            raise ValueError(f"RouterConfig.max_attempts={self.max_attempts!r}: must be >= 1")
        check_admin_key(self.admin_api_key)


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


def _error_of(response: httpx.Response) -> ApiError:
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


class Router:
    """Example::

    router = Router(RouterConfig(backends=["http://127.0.0.1:30001", "http://127.0.0.1:30002"]))
    results = router.run_step(0, [("p0", [1, 5, 7]), ("p1", [1, 9])], group_size=4,
                              sampling_params={"max_new_tokens": 32, "temperature": 1.0})
    len(results)  # 8: prompt i, sample j at index i * 4 + j
    """

    def __init__(self, config: RouterConfig, cost: CostModel | None = None) -> None:
        self.config = config
        headers = {"Content-Type": "application/json"}
        if config.admin_api_key:
            headers["Authorization"] = f"Bearer {config.admin_api_key}"
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
        self._pool = ThreadPoolExecutor(max_workers=max(8, 4 * len(self.backends)), thread_name_prefix="router")
        self._stop = threading.Event()
        self._health_thread: threading.Thread | None = None
        self._model_limits: ModelLimits | None = None
        self._weights: dict[str, Any] | None = None  # the last weight update every backend took
        self.steps = 0

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.check_health()
        self._health_thread = threading.Thread(target=self._health_loop, name="router-health", daemon=True)
        self._health_thread.start()

    def begin_shutdown(self) -> None:
        """Stop taking requests and fail the running backend calls now (SIGTERM: answers go out, nothing waits
        for the backends)."""
        self._stop.set()
        for b in self.backends:
            b.http.close()

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
            up = b.client.health()
            if up and not b.healthy and self._weights is not None:
                up = self._resync_weights(b)
            b.healthy = up
        return [b.healthy for b in self.backends]

    def _resync_weights(self, backend: Backend) -> bool:
        """A backend that comes back (e.g. restarted) first loads the weights the others hold."""
        try:
            response = backend.http.post("/update_weights_from_disk", content=_dumps(self._weights))
        except httpx.HTTPError:
            return False
        backend.count("weight_resyncs")
        return response.status_code == 200

    def healthy(self) -> list[Backend]:
        return [b for b in self.backends if b.healthy]

    def _live(self) -> list[Backend]:
        if self._stop.is_set():
            raise RouterError(503, "the router is shutting down")
        live = self.healthy()
        if not live:
            raise RouterError(503, "no healthy backend")
        return live

    def model_limits(self) -> ModelLimits | None:
        """Vocabulary and context length of the served model (asked from a backend once), or None if unknown."""
        if self._model_limits is None:
            for b in self.healthy():
                try:
                    info = b.client.model_info()
                    vocab, ctx = info.get("vocab_size"), info.get("max_context_len")
                except Exception:  # a backend answering garbage: validation falls back to the backends
                    continue
                if isinstance(vocab, int) and isinstance(ctx, int):
                    self._model_limits = ModelLimits(vocab, ctx, info.get("tokenizer_path") is not None)
                    break
        return self._model_limits

    def validate_generate(self, body: GenerateBody, limits: RequestLimits | None = None) -> None:
        """The server's validation of a /generate body: all of it for ``input_ids`` bodies once the model is
        known, all but the token-level checks for ``text`` (the backend tokenizes and checks those)."""
        limits = limits or self.config.limits
        check_generate_body(body, limits)
        model = self.model_limits()
        if body.text is None and model is not None:
            to_generation_inputs(body, model, None, limits)

    # ---- a whole step ------------------------------------------------------------------------------------
    def step(self, body: StepBody, on_rids: Callable[[list[str]], None] | None = None) -> dict[str, Any]:
        """``POST /histopipe/step`` after validation: ``{"step", "results"}``; ``on_rids`` as in :meth:`generate`."""
        limits = self.config.limits
        generate = step_to_generate_body(body, limits)
        self.validate_generate(generate, dataclasses.replace(limits, max_prompts=limits.max_samples))
        prompts = [(str(p.prompt_id), list(p.input_ids)) for p in body.prompts]
        sp = None if body.sampling_params is None else body.sampling_params.model_dump(exclude_unset=True)
        step_no = self.steps if body.step is None else body.step
        rids = [uuid.uuid4().hex for _ in range(len(prompts) * body.group_size)]
        if on_rids is not None:
            on_rids(rids)
        results = self.run_step(step_no, prompts, body.group_size, sp, body.return_logprob, rids)
        return {"step": step_no, "results": results}

    def run_step(
        self,
        step: int,
        prompts: Sequence[tuple[str, list[int]]],
        group_size: int,
        sampling_params: dict[str, Any] | None = None,
        return_logprob: bool = False,
        rids: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Generate ``group_size`` samples of every prompt; answers in request order (prompt i, sample j at i*G+j).

        Each answer is the backend's SGLang item plus ``meta_info.histopipe`` = ``{"backend", "attempts"}``.
        ``rids``: one request id per sample (default: fresh ones), for aborting them.
        """
        if not isinstance(group_size, int) or group_size < 1:
            raise RouterError(400, f"group_size: must be an int >= 1, got {group_size!r}", "group_size")
        if not prompts:
            raise RouterError(400, "prompts: empty step", "prompts")
        live = self._live()
        groups = [Group(pid, group_size, len(ids)) for pid, ids in prompts]
        with self._lock:
            plan = self.planner.plan(step, groups, len(live), self.predictor)
        items: list[dict[str, Any]] = []
        for pid, ids in prompts:
            for _ in range(group_size):
                sp = dict(sampling_params or {})
                sp["custom_params"] = {**sp.get("custom_params", {}), "prompt_id": pid}
                item = {"input_ids": list(ids), "sampling_params": sp, "return_logprob": return_logprob}
                item["rid"] = rids[len(items)] if rids is not None else uuid.uuid4().hex
                items.append(item)
        placement = {
            self.backends.index(live[w]): [g * group_size + s for g, s in reqs] for w, reqs in enumerate(plan.workers)
        }
        predicted = [plan.predicted_lengths[i // group_size] for i in range(len(items))]
        results = [outs[0] for outs in self._dispatch(items, placement, predicted)]
        with self._lock:
            for i, out in enumerate(results):
                pid = prompts[i // group_size][0]
                self.predictor.observe(pid, max(0, step), _completion_tokens(out))
            self.steps += 1
        return results

    # ---- plain /generate ---------------------------------------------------------------------------------
    def generate(self, body: dict[str, Any] | GenerateBody, on_rids: Callable[[list[str]], None] | None = None) -> Any:
        """Forward an SGLang /generate body (validated as a server would); batch bodies are split per prompt and
        placed per prompt, ``n`` samples of a prompt stay together. Answers exactly what one server answers.
        ``on_rids`` receives the request ids of every sample before any is sent (to abort them)."""
        if not isinstance(body, GenerateBody):
            body = GenerateBody.model_validate(body)
        self.validate_generate(body)
        raw = body.model_dump(exclude_unset=True)
        rids = [r if r is not None else uuid.uuid4().hex for r in item_rids(body)]
        batch = isinstance(raw.get("text"), list) or (
            isinstance(raw.get("input_ids"), list) and bool(raw["input_ids"]) and isinstance(raw["input_ids"][0], list)
        )
        raw["rid"] = rids if batch else rids[0]
        items, _ = split_generate_body(raw)
        counts = [int((item.get("sampling_params") or {}).get("n", 1)) for item in items]
        if on_rids is not None:
            on_rids([sample_rid(r, j, c) or "" for r, c in zip(rids, counts) for j in range(c)])
        predicted = []
        for item, count in zip(items, counts):
            pid = ((item.get("sampling_params") or {}).get("custom_params") or {}).get("prompt_id")
            pid = None if pid is None else str(pid)
            mean = self.predictor.predict(pid).mean if pid is not None else self.predictor.prior().mean
            predicted.append(mean * count)
        placement: dict[int, list[int]] = {}
        with self._lock:
            live = self._live()
            load = {self.backends.index(b): b.outstanding for b in live}
            for i in sorted(range(len(items)), key=lambda i: -predicted[i]):
                target = min(load, key=lambda k: (load[k], k))
                placement.setdefault(target, []).append(i)
                load[target] += predicted[i]
        grouped = self._dispatch(items, placement, predicted, counts)
        with self._lock:
            for item, outs in zip(items, grouped):
                pid = ((item.get("sampling_params") or {}).get("custom_params") or {}).get("prompt_id")
                if pid is not None:
                    for out in outs:
                        self.predictor.observe(str(pid), self.steps, _completion_tokens(out))
        flat = [out for outs in grouped for out in outs]
        return flat if batch or len(flat) > 1 else flat[0]

    def abort(self, rids: list[str]) -> None:
        """Abort these requests on every backend (a client that went away); best effort."""
        if not rids:
            return
        for b in self.healthy():
            try:
                b.http.post("/abort_request", content=_dumps({"rid": rids}), timeout=5.0)
            except httpx.HTTPError:
                continue

    # ---- history and admin fan-out -----------------------------------------------------------------------
    def push_history(self, body: HistoryPushBody | dict[str, Any]) -> dict[str, Any]:
        """Validate a history push as a server would, send it to every healthy backend, and only then let the
        lengths feed the predictor (a push the backends refuse changes nothing here).
        Example: ``router.push_history({"step": 3, "entries": [{"prompt_id": "p0", "responses": [[5, 9]]}]})``."""
        if not isinstance(body, HistoryPushBody):
            body = HistoryPushBody.model_validate(body)
        checked = to_history_entries(body, self.model_limits(), self.config.limits)
        answers = self._fan_out("/histospec/history", body.model_dump(exclude_unset=True))
        with self._lock:
            for e in checked:
                lengths = [len(r) for r in e.responses if r]
                if lengths:
                    self.predictor.add(e.prompt_id, int(body.step), lengths)
        done = [a["accepted"] for a in answers.values() if isinstance(a, dict) and "accepted" in a]
        return {"accepted": min(done), "backends": answers}

    def end_step(self, step: int | None) -> dict[str, Any]:
        return {"success": True, "backends": self._fan_out("/histospec/end_step", {"step": step})}

    def update_weights(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Fan a weight update out to every healthy backend; remembered, so a backend that comes back loads it."""
        answers = self._fan_out("/update_weights_from_disk", raw)
        self._weights = dict(raw)
        messages = {a.get("message") for a in answers.values() if isinstance(a, dict)}
        message = messages.pop() if len(messages) == 1 else "Succeeded to update model weights."
        return {"success": True, "message": message, "num_paused_requests": 0, "backends": answers}

    def flush_cache(self) -> str:
        answers = self._fan_out("/flush_cache", None, parse=False)
        texts = {a for a in answers.values() if isinstance(a, str)}
        return texts.pop() if len(texts) == 1 else "Cache flushed."

    def backend_get(self, path: str) -> Any:
        """GET ``path`` from a healthy backend (model info: every backend serves the same model)."""
        for b in self._live():
            try:
                response = b.http.get(path, timeout=30.0)
            except httpx.HTTPError:
                self._down(b)
                continue
            if response.status_code >= 400:
                raise _error_of(response)
            return response.json()
        raise RouterError(503, "every backend failed")

    def fan_out_raw(self, path: str, body: Any) -> dict[str, Any]:
        """POST ``body`` to every healthy backend (see ``_fan_out``); per-backend answers."""
        return self._fan_out(path, body)

    def _fan_out(self, path: str, body: Any, parse: bool = True) -> dict[str, Any]:
        """POST to every healthy backend in parallel. A 4xx from any backend is the answer (the same for all:
        they serve the same model); a backend that fails otherwise is marked down; at least one must succeed."""
        live = self._live()
        content = b"" if body is None else _dumps(body)
        futures = {self._pool.submit(b.http.post, path, content=content): b for b in live}
        per_backend: dict[str, Any] = {}
        refused: ApiError | None = None
        for fut, b in futures.items():
            try:
                response = fut.result()
            except httpx.HTTPError as exc:
                self._down(b)
                per_backend[b.url] = {"error": {"message": f"{type(exc).__name__}: {exc}"}}
                continue
            if response.status_code >= 400:
                err = _error_of(response)
                if response.status_code < 500:
                    refused = refused or err
                else:
                    self._down(b)
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

    # ---- dispatch ----------------------------------------------------------------------------------------
    def _dispatch(
        self,
        items: list[dict[str, Any]],
        placement: dict[int, list[int]],
        predicted: list[float],
        counts: list[int] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Run ``placement`` (backend index -> item indices); resubmit the items of failed calls elsewhere.
        Item i is answered by ``counts[i]`` outputs (its ``n`` samples)."""
        counts = counts or [1] * len(items)
        results: list[list[dict[str, Any]] | None] = [None] * len(items)
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
                expected = sum(counts[i] for i in idx)
                if len(outs) != expected:
                    raise RouterError(502, f"{backend.url} answered {len(outs)} items for {expected} samples")
                pos = 0
                for i in idx:
                    assert results[i] is None, "a request was answered twice"
                    results[i] = outs[pos : pos + counts[i]]
                    pos += counts[i]
                    for out in results[i]:
                        meta = out.setdefault("meta_info", {})
                        meta["histopipe"] = {"backend": backend.url, "attempts": attempts[i]}
                backend.count("requests", len(outs))
                backend.count("completion_tokens", sum(_completion_tokens(o) for o in outs))
        assert all(r is not None for r in results), "a request was lost"
        return results  # type: ignore[return-value]

    def _resubmit(self, idx: list[int], attempts: list[int], predicted: list[float], submit, exclude: int) -> None:  # noqa: ANN001
        if self._stop.is_set():
            raise RouterError(503, "the router is shutting down")
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
            response = backend.http.post("/generate", content=_dumps(body))
        except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: the client was closed at shutdown
            raise _BackendDown(str(exc)) from exc
        if response.status_code >= 500:
            raise _BackendDown(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise _error_of(response)
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

    def histospec_stats(self) -> dict[str, Any]:
        """A server's ``/histospec/stats`` summed over the healthy backends (``tau`` recomputed), plus
        ``per_backend`` and the router's own ``router`` stats."""
        per_backend: dict[str, Any] = {}
        for b in self.healthy():
            try:
                per_backend[b.url] = b.client.stats()
            except Exception as exc:  # a backend that cannot answer is listed with the reason
                per_backend[b.url] = {"error": {"message": f"{type(exc).__name__}: {exc}"}}
        total: dict[str, Any] = {}
        history: dict[str, Any] = {}
        for st in per_backend.values():
            for k, v in st.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "tau":
                    total[k] = total.get(k, 0) + v
            for k, v in (st.get("history") or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    history[k] = history.get(k, 0) + v
        if "generated_tokens" in total:
            total["tau"] = total["generated_tokens"] / total["verify_steps"] if total.get("verify_steps") else 1.0
        return {**total, "history": history, "per_backend": per_backend, "router": self.stats()}

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


def _dumps(body: Any) -> bytes:
    """JSON with non-ASCII escaped: encodes whatever the client sent."""
    return json.dumps(body, separators=(",", ":")).encode()


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
