"""The HistoPipe router's logic (no HTTP server here; ``router/app.py`` puts routes on it).

:class:`Router` holds one connection per rollout server, their health, a length predictor and a planner; it plans
and dispatches steps (``run_step``, ``overlap_step``), places plain ``/generate`` items per prompt, resubmits the
requests of a failed backend and migrates or defers outliers (rules: its class docstring; the HTTP API: README,
"HistoPipe: balancing rollout workers"). Example: :class:`Router`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglang_histospec.drafting.prompt_ids import explicit_prompt_id, prompt_id_for
from sglang_histospec.drafting.types import tau
from sglang_histospec.pipe.lengths import LengthEstimate, LengthPredictor, LengthPredictorConfig
from sglang_histospec.pipe.migration import InFlight, backlog_s, decode_rate, pick_deferrals, pick_migrations
from sglang_histospec.pipe.planner import POLICIES, Group, Planner, PlannerConfig
from sglang_histospec.pipe.worker_cost import CostModel
from sglang_histospec.router.recovery import REPLAY_MAX_BYTES, REPLAY_STEPS, PushLog, health_answer, replay_pushes
from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.http_api import ApiError, check_admin_key
from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import (
    DEFAULT_MAX_NEW_TOKENS,
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

SHUTDOWN_POLL_S = 0.1
"""Seconds between two checks, while a call waits for its backends, of whether the router is shutting down."""

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


BACKEND_COUNTERS = (
    "requests",
    "completion_tokens",
    "failures",
    "failed_requests",
    "resubmitted_in",
    "migrated_out",
    "migrated_in",
    "deferred",
)
"""Per-backend counters in ``/metrics`` (``histopipe_backend_<name>_total``)."""


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
    migrate_outliers: bool = True
    """Abort running outliers and resume them on an idle backend (one /generate call per request); False =
    one batched call per backend, no migration."""
    outlier_check_s: float = 0.05
    """Seconds between two outlier scans of a step's running requests."""
    max_inflight: int = 256
    """With migration: at most this many /generate calls in flight at once (the rest wait in the router)."""
    planner: PlannerConfig | None = None
    """Outlier rule (``outlier_factor``, ``tail_fraction``, with overlap ``max_deferrals`` and
    ``defer_step_factor``) and planner settings; None = defaults with ``policy``."""
    overlap: bool = False
    """One-step overlap, opt-in (its data is one step off-policy): a step (:meth:`Router.overlap_step`,
    ``POST /histopipe/step``) returns once the requests the deferral rule does not defer are answered; deferred
    ones keep running and are answered with the next step call or :meth:`Router.drain` (``POST
    /histopipe/drain``). Outliers are deferred, not migrated. Needs ``migrate_outliers`` (one call per request).
    False = synchronous steps (:meth:`Router.run_step`)."""

    limits: RequestLimits = field(default_factory=RequestLimits)
    """The same client limits as a server's (checked before anything is forwarded)."""
    max_request_bytes: int = 64 * 2**20
    """Larger request bodies get HTTP 413."""
    replay_steps: int = REPLAY_STEPS
    """History pushes of this many newest steps (current and previous) are kept and replayed to a backend that
    comes back or is added, before requests are routed to it (``router/recovery.py``)."""
    replay_max_bytes: int = REPLAY_MAX_BYTES
    """Bound on the kept pushes; the oldest go first (``/health`` then lists their steps as incomplete)."""

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("RouterConfig.backends is empty: give at least one rollout server URL")
        if self.policy not in POLICIES:
            raise ValueError(f"RouterConfig.policy={self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.replay_steps < 1 or self.replay_max_bytes < 1:
            raise ValueError(
                f"RouterConfig.replay_steps={self.replay_steps!r}, replay_max_bytes={self.replay_max_bytes!r}: "
                "both must be >= 1"
            )
        if self.max_attempts < 1:
            raise ValueError(f"RouterConfig.max_attempts={self.max_attempts!r}: must be >= 1")
        check_admin_key(self.admin_api_key)
        if not self.outlier_check_s > 0:
            raise ValueError(f"RouterConfig.outlier_check_s={self.outlier_check_s!r}: must be > 0 seconds")
        if not (isinstance(self.max_inflight, int) and self.max_inflight >= 1):
            raise ValueError(f"RouterConfig.max_inflight={self.max_inflight!r}: must be an int >= 1")
        if self.overlap and not self.migrate_outliers:
            raise ValueError("RouterConfig.overlap needs migrate_outliers=True (one /generate call per request)")
        if self.planner is not None and self.planner.policy != self.policy:
            raise ValueError(
                f"RouterConfig.planner.policy={self.planner.policy!r} differs from policy={self.policy!r}: set one"
            )


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


class _BackendDown(Exception):
    pass


@dataclass(slots=True)
class StepAnswers:
    """The answer of a step call with one-step overlap (:meth:`Router.overlap_step`, ``POST /histopipe/step``)."""

    step: int
    results: list[dict[str, Any] | None]
    """This step's answers in request order (prompt i, sample j at i * G + j); None where deferred."""
    deferred: list[int]
    """Indices in ``results`` of the requests still running: they are answered with a later call (``carried``)."""
    carried: list[dict[str, Any]]
    """Answers of earlier steps' deferred requests that finished by now: ``meta_info.histopipe.step`` and
    ``.index`` say which request of which step, ``.weight_version`` the weight version when it was sent."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "results": self.results, "deferred": self.deferred, "carried": self.carried}


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
    """One router over the rollout servers: places, dispatches, resubmits, migrates or defers. Example::

    router = Router(RouterConfig(backends=["http://127.0.0.1:30001", "http://127.0.0.1:30002"]))
    results = router.run_step(0, [("p0", [1, 5, 7]), ("p1", [1, 9])], group_size=4,
                              sampling_params={"max_new_tokens": 32, "temperature": 1.0})
    len(results)  # 8: prompt i, sample j at index i * 4 + j

    It holds one connection per rollout server (backend), their health, a :class:`LengthPredictor` fed by every
    response and history push, and a :class:`Planner`. A step (``run_step``) is planned across the healthy backends
    and dispatched as one batched ``/generate`` per backend, in parallel. A backend whose call fails (connection
    error, timeout or 5xx) is marked down and the requests of that call are resubmitted to the other healthy
    backends (least predicted work first): a batched call returns all its answers or none, so every request is
    answered exactly once. Plain ``/generate`` bodies are split per item and placed per prompt (the servers' prompt
    id, :func:`item_prompt_id`) on the backend with the least outstanding predicted work.

    Outlier migration (``migrate_outliers``, on by default, for ``run_step``): requests then go out as one /generate
    call each, at most the cost model's ``max_running`` in flight per backend (the rest are sent in plan order as
    slots free up, so none waits in a backend's queue), and while a step is in its tail the dispatcher applies the
    simulator's rule (pipe/migration.py) every ``outlier_check_s``: a request estimated far past its prompt's history
    (tokens emitted = time since it was sent x the step's decode rate) is aborted on its backend (SGLang's
    ``POST /abort_request``, which the rollout server implements too) and its prompt plus the tokens it emitted go
    to an idle backend, with the same sampling params and ``custom_params.seed_offset`` = tokens emitted, so a
    seeded request continues with the draws it would have used (token-identical on the torch backend; SGLang
    samples the continuation afresh). The answer is the two parts joined; ``meta_info.histopipe.migrated_from``
    names the first backend. Plain ``/generate`` forwarding keeps the batched calls.

    One-step overlap (``overlap``, opt-in; :meth:`Router.overlap_step`): the simulator's deferral rule replaces
    migration. While a step is in its tail, a request past its deferral threshold (pipe/migration.py
    ``pick_deferrals``: ``outlier_factor``, ``max_deferrals``, ``defer_step_factor``) is no longer waited for: the
    step call returns once its other requests are answered, the deferred ones keep running on their backends and their
    answers come back with the next step call (``carried``), or :meth:`Router.drain`. A carried request counts for the
    step that receives it (its tail, its deferral rule) and its backend's remaining work is the ``backlog`` of that
    step's plan. Each answer says the step it was submitted in and the weight version then (``meta_info.histopipe``).
    """

    def __init__(self, config: RouterConfig, cost: CostModel | None = None) -> None:
        self.config = config
        headers = {"Content-Type": "application/json"}
        if config.admin_api_key:
            headers["Authorization"] = f"Bearer {config.admin_api_key}"
        self._headers = headers
        self.backends = [self._connect(url) for url in config.backends]
        self.pushes = PushLog(config.replay_steps, config.replay_max_bytes)
        self._push_lock = threading.Lock()  # a push fans out, or a backend is brought back, never both at once
        self.predictor = LengthPredictor(LengthPredictorConfig(window=2))
        self.planner = Planner(cost or CostModel(), config.planner or PlannerConfig(policy=config.policy))
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(8, 4 * len(self.backends)), thread_name_prefix="router")
        self._calls = ThreadPoolExecutor(max_workers=config.max_inflight, thread_name_prefix="router-call")
        self.migrations = 0
        self._current_rids: dict[str, str] = {}  # rid a client knows -> rid of its running resubmission
        self._aborted: set[str] = set()  # rids a client aborted while they ran (not migrated any more)
        self._stop = threading.Event()
        self._health_thread: threading.Thread | None = None
        self._model_limits: ModelLimits | None = None
        self._weights: dict[str, Any] | None = None  # the last weight update every backend took
        self.steps = 0
        self.deferred = 0  # requests a step call returned without (answered with a later call)
        self.weight_version: str | None = None  # the last weight_version sent through update_weights
        self._carry: _Flights | None = None  # with overlap: the last step's requests still running
        self._overlap_lock = threading.Lock()  # with overlap: one step (or drain) at a time

    def _connect(self, url: str) -> Backend:
        timeout = self.config.request_timeout_s
        return Backend(
            url.rstrip("/"),
            HistoSpecClient(url, admin_api_key=self.config.admin_api_key, timeout=timeout),
            httpx.Client(base_url=url.rstrip("/"), headers=self._headers, timeout=timeout),
        )

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
        self._calls.shutdown(wait=False, cancel_futures=True)
        for b in self.backends:
            b.client.close()
            b.http.close()

    def _health_loop(self) -> None:
        while not self._stop.wait(self.config.health_interval_s):
            self.check_health()

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
        if self._weights is not None and not self._resync_weights(backend):
            backend.problem = "weight resync failed"
            return
        with self._push_lock:
            bodies = self.pushes.bodies()
            backend.problem = replay_pushes(backend.http, bodies)
            if backend.problem is not None:
                return
            backend.healthy = True
        if bodies:
            backend.count("history_replays")
            backend.count("replayed_pushes", len(bodies))

    def add_backend(self, url: str) -> dict[str, Any]:
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
        if self.config.overlap:
            answers = self.overlap_step(
                step_no, prompts, body.group_size, sp, return_logprob=body.return_logprob, rids=rids
            )
            return answers.to_json()
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
        item_params: Sequence[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Generate ``group_size`` samples of every prompt; answers in request order (prompt i, sample j at i*G+j).

        Each answer is the backend's SGLang item plus ``meta_info.histopipe`` = ``{"backend", "attempts", ...}``.
        ``rids``: one request id per sample (default: fresh ones), for aborting them. ``item_params``: per request
        (index i*G+j), sampling params merged over ``sampling_params`` (e.g. one seed per sample).
        Synchronous only: with ``overlap`` call :meth:`overlap_step`.
        """
        if self.config.overlap:
            raise RouterError(409, "RouterConfig.overlap is on: call overlap_step (its answer has deferred requests)")
        options = {"return_logprob": return_logprob, "rids": rids, "item_params": item_params}
        items, placement, predicted, estimates = self._plan_step(
            step, prompts, group_size, sampling_params, self._live(), **options
        )
        results = [outs[0] for outs in self._dispatch(items, placement, predicted, estimates=estimates)]
        self._observe(step, items, results)
        return results

    def overlap_step(
        self,
        step: int,
        prompts: Sequence[tuple[str, list[int]]],
        group_size: int,
        sampling_params: dict[str, Any] | None = None,
        **options: Any,
    ) -> StepAnswers:
        """:meth:`run_step` (the same arguments: ``options`` are its ``return_logprob``, ``rids``,
        ``item_params``) with one-step overlap (``RouterConfig.overlap``): returns once the step's requests
        that the deferral rule leaves alone are answered, with the answers of earlier steps' deferred requests
        that finished meanwhile (:class:`StepAnswers`). One step call at a time (a second one waits).

        Example: a straggler of step 3 is ``None`` in step 3's ``results`` (its index in ``deferred``) and its
        answer is in step 4's ``carried``, with ``meta_info.histopipe.step == 3``.

        A step call that fails once dispatched (503, a backend's 4xx) also drops the earlier steps' deferred
        requests it had taken over: their answers are not returned by any later call.
        """
        if not self.config.overlap:
            raise RouterError(409, "RouterConfig.overlap is off: call run_step")
        with self._overlap_lock:
            live = self._live()
            carry = self._carry
            backlog = None if carry is None else carry.backlog([self.backends.index(b) for b in live])
            items, placement, predicted, estimates = self._plan_step(
                step, prompts, group_size, sampling_params, live, backlog, **options
            )
            self._carry = None  # the new step takes the carried requests over, or they are lost with it
            flights = _Flights(self, items, predicted, estimates, step=step, carry=carry, defer=True)
            flights.run(placement)
            return self._deliver(step, flights)

    def drain(self) -> list[dict[str, Any]]:
        """With ``overlap``: wait for every deferred request still running and return their answers (as in
        :attr:`StepAnswers.carried`); ``[]`` when none runs. Call it after the last step."""
        with self._overlap_lock:
            carry, self._carry = self._carry, None
            if carry is None:
                return []
            flights = _Flights(self, [], [], [], step=carry.step, carry=carry, defer=False)
            flights.run({})
            return self._deliver(None, flights).carried

    def _deliver(self, step: int | None, flights: _Flights) -> StepAnswers:
        """Feed the predictor with what ``flights`` answered, keep what still runs for the next step call."""
        answers = flights.answers(step)
        with self._lock:
            for i, f in flights.flights.items():
                out = flights.results[i]
                if out is not None:
                    self._observe_one(f.step, flights.items[i], out)
            if step is not None:
                self.steps += 1
        self._carry = flights if flights.pending() else None
        return answers

    def _observe(self, step: int, items: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        with self._lock:
            for item, out in zip(items, results):
                self._observe_one(step, item, out)
            self.steps += 1

    def _observe_one(self, step: int, item: dict[str, Any], out: dict[str, Any]) -> None:
        pid = item_prompt_id(item)
        if pid is not None:
            self.predictor.observe(pid, max(0, step), _completion_tokens(out))

    def _plan_step(
        self,
        step: int,
        prompts: Sequence[tuple[str, list[int]]],
        group_size: int,
        sampling_params: dict[str, Any] | None,
        live: list[Backend],
        backlog: list[float] | None = None,
        *,
        return_logprob: bool = False,
        rids: list[str] | None = None,
        item_params: Sequence[dict[str, Any]] | None = None,
    ) -> tuple[list[dict[str, Any]], dict[int, list[int]], list[float], list[LengthEstimate]]:
        """A step's items, placement (backend index -> item indices), predicted lengths and estimates."""
        if not isinstance(group_size, int) or group_size < 1:
            raise RouterError(400, f"group_size: must be an int >= 1, got {group_size!r}", "group_size")
        if not prompts:
            raise RouterError(400, "prompts: empty step", "prompts")
        if item_params is not None and len(item_params) != len(prompts) * group_size:
            raise RouterError(
                400, f"item_params has {len(item_params)} entries for {len(prompts) * group_size} requests"
            )
        groups = [Group(pid, group_size, len(ids)) for pid, ids in prompts]
        with self._lock:
            plan = self.planner.plan(
                step, groups, len(live), self.predictor, backlog=backlog, overlap=self.config.overlap
            )
        items: list[dict[str, Any]] = []
        for pid, ids in prompts:
            for _ in range(group_size):
                sp = {**(sampling_params or {}), **(item_params[len(items)] if item_params is not None else {})}
                sp["custom_params"] = {**sp.get("custom_params", {}), "prompt_id": pid}
                item = {"input_ids": list(ids), "sampling_params": sp, "return_logprob": return_logprob}
                item["rid"] = rids[len(items)] if rids is not None else uuid.uuid4().hex
                items.append(item)
        placement = {
            self.backends.index(live[w]): [g * group_size + s for g, s in reqs] for w, reqs in enumerate(plan.workers)
        }
        predicted = [plan.predicted_lengths[i // group_size] for i in range(len(items))]
        with self._lock:
            estimates = [self.predictor.predict(pid) for pid, _ in prompts for _ in range(group_size)]
        return items, placement, predicted, estimates

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
            pid = item_prompt_id(item)
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
                pid = item_prompt_id(item)
                if pid is not None:
                    for out in outs:
                        self.predictor.observe(pid, self.steps, _completion_tokens(out))
        flat = [out for outs in grouped for out in outs]
        return flat if batch or len(flat) > 1 else flat[0]

    def abort(self, rids: list[str]) -> None:
        """Abort these requests on every backend (a client that went away); best effort. A request of a step
        that was migrated or resubmitted is aborted under its current rid too, and is not migrated again."""
        if not rids:
            return
        with self._lock:
            self._aborted.update(r for r in rids if r in self._current_rids)
            rids = list(rids) + [self._current_rids[r] for r in rids if self._current_rids.get(r, r) != r]
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
        content = _dumps(body.model_dump(exclude_unset=True))
        with self._push_lock:  # kept for replay once every healthy backend took it
            answers = self._fan_out("/histospec/history", content)
            self.pushes.record(int(body.step), content)
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
        if raw.get("weight_version") is not None:
            self.weight_version = str(raw["weight_version"])
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
        content = body if isinstance(body, bytes) else b"" if body is None else _dumps(body)
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
        estimates: list[LengthEstimate] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Run ``placement`` (backend index -> item indices); resubmit the items of failed calls elsewhere.
        Item i is answered by ``counts[i]`` outputs (its ``n`` samples). With ``estimates`` (one sample per item)
        and ``migrate_outliers``: one call per request, outliers migrated (the class docstring)."""
        counts = counts or [1] * len(items)
        if self.config.migrate_outliers and estimates is not None and all(c == 1 for c in counts):
            return [[out] for out in _Flights(self, items, predicted, estimates).run(placement)]
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
            done, _ = wait(list(running), timeout=SHUTDOWN_POLL_S, return_when=FIRST_COMPLETED)
            if self._stop.is_set():  # begin_shutdown: fail the call now, wait for no backend
                raise RouterError(503, "the router is shutting down")
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
        for b, chunk in self._replace(idx, attempts, predicted, exclude).items():
            self.backends[b].count("resubmitted_in", len(chunk))
            submit(b, chunk)

    def _replace(
        self, idx: list[int], attempts: list[int], predicted: list[float], exclude: int
    ) -> dict[int, list[int]]:
        """New backends (least outstanding work first) for the requests of a failed call."""
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
        return moved

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

    def _abort(self, backend: Backend, rid: str) -> bool:
        """SGLang's abort route on ``backend``; False when the backend did not take it."""
        try:
            response = backend.http.post("/abort_request", content=_dumps({"rid": rid}), timeout=10.0)
        except (httpx.HTTPError, RuntimeError):  # RuntimeError: the client was closed at shutdown
            return False
        return response.status_code < 400

    def _down(self, backend: Backend) -> None:
        backend.healthy, backend.problem = False, "a call failed; back once its health check passes"
        backend.count("failures")

    # ---- observability -----------------------------------------------------------------------------------
    def carried(self) -> int:
        """With overlap: deferred requests still running, to be answered with the next step call or drain."""
        carry = self._carry
        return 0 if carry is None else len(carry.pending())

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy,
            "steps": self.steps,
            "migrations": self.migrations,
            "deferred": self.deferred,
            "carried": self.carried(),
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
            total["tau"] = tau(total["generated_tokens"], total.get("verify_steps", 0))
        return {**total, "history": history, "per_backend": per_backend, "router": self.stats()}

    def metrics_text(self) -> str:
        lines = [
            "# TYPE histopipe_backend_healthy gauge",
            *(f'histopipe_backend_healthy{{backend="{b.url}"}} {int(b.healthy)}' for b in self.backends),
        ]
        for name in BACKEND_COUNTERS:
            lines.append(f"# TYPE histopipe_backend_{name}_total counter")
            lines += [
                f'histopipe_backend_{name}_total{{backend="{b.url}"}} {b.counters.get(name, 0)}' for b in self.backends
            ]
        lines += ["# TYPE histopipe_steps_total counter", f"histopipe_steps_total {self.steps}"]
        lines += ["# TYPE histopipe_migrations_total counter", f"histopipe_migrations_total {self.migrations}"]
        lines += ["# TYPE histopipe_deferred_total counter", f"histopipe_deferred_total {self.deferred}"]
        lines += ["# TYPE histopipe_carried_requests gauge", f"histopipe_carried_requests {self.carried()}"]
        return "\n".join(lines) + "\n"


@dataclass(slots=True)
class _Flight:
    """One request of a per-request dispatch: its current submission and what earlier ones emitted."""

    backend: int
    rid: str
    started: float
    base: str = ""  # the rid of its first submission (the one a client knows); resubmissions are "<base>~<k>"
    decoding: float | None = None  # when it was sent (it joins its backend's batch at once; None: held back)
    body: dict[str, Any] = field(default_factory=dict)  # the item of its current submission
    attempts: int = 1
    moved: bool = False
    target: int | None = None  # set while an abort for migration is under way
    head: dict[str, Any] | None = None  # the aborted part's answer (output_ids, text, logprobs) once migrated
    sources: list[str] = field(default_factory=list)
    intervals: list[list[Any]] = field(default_factory=list)  # [backend url, server_received, server_answered]
    step: int = 0  # the step it was submitted in, and its index there
    index: int = 0
    weight_version: str | None = None  # the router's weight version when it was first sent
    deferrals: int = 0  # times the deferral rule passed it on (one-step overlap)
    passed: int = 0  # step calls that returned without it


class _Flights:
    """Per-request dispatch with outlier migration or, with ``defer``, deferral (see :class:`Router`); one
    instance per step call. Items ``[0, own)`` are the step's own; after them come the requests that ``carry``
    (the previous step call's instance) deferred and that still run, taken over with their backend calls."""

    def __init__(
        self,
        router: Router,
        items: list[dict[str, Any]],
        predicted: list[float],
        estimates: list[LengthEstimate],
        step: int = 0,
        carry: _Flights | None = None,
        defer: bool = False,
    ) -> None:
        self.router, self.items, self.predicted, self.estimates = router, list(items), list(predicted), list(estimates)
        self.step, self.own, self.defer = step, len(items), defer
        self.step_mean = sum(predicted) / len(predicted) if predicted else 0.0  # = the plan's mean_predicted()
        self.results: list[dict[str, Any] | None] = [None] * len(items)
        self.flights: dict[int, _Flight] = {}
        self.running: dict[Future, int] = {}
        self.rates: list[tuple[int, float]] = []
        self.tag = uuid.uuid4().hex[:12]
        self.held: dict[int, deque[int]] = {}  # per backend, requests not sent yet, in plan order
        self.inflight: dict[int, int] = {}
        self.deferred: set[int] = set()  # requests this step call no longer waits for
        self.cap = router.planner.cost.config.max_running
        if carry is not None:
            self._adopt(carry)

    def _adopt(self, carry: _Flights) -> None:
        """Take over ``carry``'s unanswered requests (oldest step first), their running calls and held queues."""
        moved: dict[int, int] = {}
        for j in sorted(carry.pending(), key=lambda j: (carry.flights[j].step, carry.flights[j].index)):
            moved[j] = len(self.items)
            self.items.append(carry.items[j])
            self.predicted.append(carry.predicted[j])
            self.estimates.append(carry.estimates[j])
            self.results.append(None)
            self.flights[moved[j]] = carry.flights[j]
        self.running = {fut: moved[j] for fut, j in carry.running.items()}
        self.held = {b: deque(moved[j] for j in q) for b, q in carry.held.items()}
        self.inflight = dict(carry.inflight)

    def pending(self) -> list[int]:
        """Indices of the requests not answered yet (after :meth:`run`: the deferred ones still running)."""
        return [i for i, r in enumerate(self.results) if r is None]

    def backlog(self, backends: list[int]) -> list[float]:
        """Per backend of ``backends``, predicted seconds its pending requests still take (the next plan's
        ``backlog``)."""
        now = time.monotonic()
        flights = [
            dataclasses.replace(f, worker=backends.index(f.worker))
            for f in self._in_flight(now, self.pending())
            if f.worker in backends
        ]
        return backlog_s(flights, len(backends), decode_rate(self.rates), self.router.planner.cost)

    def answers(self, step: int | None) -> StepAnswers:
        """What this step call returns: its own answers (None where deferred), the carried ones that landed."""
        own = self.results[: self.own]
        carried = [r for r in self.results[self.own :] if r is not None]
        return StepAnswers(
            self.step if step is None else step, own, [i for i, r in enumerate(own) if r is None], carried
        )

    def run(self, placement: dict[int, list[int]]) -> list[dict[str, Any] | None]:
        """Send ``placement`` and wait until every request is answered, or deferred (then it keeps running)."""
        ok = False
        try:
            for b, idx in placement.items():
                for i in idx:
                    self._submit(i, b, self.items[i])
            while any(r is None and i not in self.deferred for i, r in enumerate(self.results)):
                assert self.running, "requests wait but none runs"
                done, _ = wait(
                    list(self.running), timeout=self.router.config.outlier_check_s, return_when=FIRST_COMPLETED
                )
                if self.router._stop.is_set():  # begin_shutdown: fail the step now, wait for no backend
                    raise RouterError(503, "the router is shutting down")
                for fut in done:
                    self._landed(self.running.pop(fut), fut)
                self._scan()
            ok = True
        finally:
            with self.router._lock:
                for i, f in self.flights.items():
                    if not ok or self.results[i] is not None:  # a request still running keeps its rid mapping
                        self.router._current_rids.pop(f.base, None)
                        self.router._aborted.discard(f.base)
        for i in self.pending():
            f = self.flights[i]
            f.passed += 1
            self.router.backends[f.backend].count("deferred")
            with self.router._lock:
                self.router.deferred += 1
        assert self.defer or not self.pending(), "a request was lost"
        return self.results

    def _submit(self, i: int, b: int, item: dict[str, Any]) -> None:
        backend = self.router.backends[b]
        f = self.flights.get(i)
        if f is None:
            rid = item.get("rid") or f"hp-{self.tag}-{i}"
            version = self.router.weight_version
            f = self.flights[i] = _Flight(
                b, rid, time.monotonic(), rid, step=self.step, index=i, weight_version=version
            )
        else:
            f.backend, f.started, f.decoding, f.attempts = b, time.monotonic(), None, f.attempts + 1
            f.rid = f"{f.base}~{f.attempts}"
        with self.router._lock:
            backend.outstanding += self.predicted[i]
            self.router._current_rids[f.base] = f.rid
        f.body = {**item, "rid": f.rid}
        self.held.setdefault(b, deque()).append(i)
        self._pump(b)

    def _pump(self, b: int) -> None:
        """Send backend ``b``'s held requests, in plan order, while it runs fewer than ``max_running`` (the cost
        model's batch cap): the backend never queues, so a request decodes from the moment it is sent."""
        held = self.held.get(b) or deque()
        while held and self.inflight.get(b, 0) < self.cap:
            i = held.popleft()
            f = self.flights[i]
            f.decoding = time.monotonic()
            self.inflight[b] = self.inflight.get(b, 0) + 1
            self.running[self.router._calls.submit(self.router._post, self.router.backends[b], [f.body])] = i

    def _landed(self, i: int, fut: Future) -> None:
        f = self.flights[i]
        backend = self.router.backends[f.backend]
        with self.router._lock:
            backend.outstanding -= self.predicted[i]
        self.inflight[f.backend] -= 1
        self._pump(f.backend)
        try:
            outs = fut.result()
        except _BackendDown:
            self.router._down(backend)
            backend.count("failed_requests")
            f.target = None
            attempts = [0] * len(self.items)
            attempts[i] = f.attempts
            for b, _ in self.router._replace([i], attempts, self.predicted, exclude=f.backend).items():
                self.router.backends[b].count("resubmitted_in")
                self._submit(i, b, self._continuation(i, f))
            return
        if len(outs) != 1:
            raise RouterError(502, f"{backend.url} answered {len(outs)} items for 1 request")
        [out] = outs
        meta = out.get("meta_info") or {}
        if "server_received" in meta:
            f.intervals.append([backend.url, meta["server_received"], meta["server_answered"]])
        with self.router._lock:
            aborted = f.base in self.router._aborted  # its client went away: its answer is the aborted part
        if f.target is not None and not aborted and (meta.get("finish_reason") or {}).get("type") == "abort":
            self._migrate(i, f, out)
            return
        f.target = None  # it finished before the abort landed: nothing to migrate
        self.rates.append((_completion_tokens(out), time.monotonic() - (f.decoding or f.started)))
        assert self.results[i] is None, "a request was answered twice"
        self.results[i] = self._join(f, out)
        backend.count("requests")
        backend.count("completion_tokens", _completion_tokens(out))

    def _migrate(self, i: int, f: _Flight, out: dict[str, Any]) -> None:
        """The abort landed: resume the request on its target with the tokens it emitted."""
        source, target = self.router.backends[f.backend], f.target
        assert target is not None
        f.head = _joined(f.head, out)
        f.sources.append(source.url)
        f.target = None
        source.count("migrated_out")
        self.router.backends[target].count("migrated_in")
        with self.router._lock:
            self.router.migrations += 1
        self._submit(i, target, self._continuation(i, f))

    def _continuation(self, i: int, f: _Flight) -> dict[str, Any]:
        """The item to send for request ``i``: prompt + the tokens emitted so far, draws offset by their count."""
        item = self.items[i]
        done = list((f.head or {}).get("output_ids") or [])
        if not done:
            return item
        sp = dict(item.get("sampling_params") or {})
        custom = dict(sp.get("custom_params") or {})
        custom["seed_offset"] = int(custom.get("seed_offset") or 0) + len(done)
        sp["custom_params"] = custom
        sp["max_new_tokens"] = max(1, int(sp.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS) - len(done))
        return {**item, "input_ids": list(item["input_ids"]) + done, "sampling_params": sp}

    def _join(self, f: _Flight, out: dict[str, Any]) -> dict[str, Any]:
        final = _joined(f.head, out)
        meta = final.setdefault("meta_info", {})
        if f.head is not None:
            meta["prompt_tokens"] = meta.get("prompt_tokens", 0) - len(f.head.get("output_ids") or [])
        if f.attempts > 1 and "id" in meta:
            meta["id"] = f.base  # the rid the client knows, not that of the resubmission
        meta["histopipe"] = {
            "backend": self.router.backends[f.backend].url,
            "attempts": f.attempts,
            "migrated_from": f.sources,
            "intervals": f.intervals,
        }
        if self.router.config.overlap:
            meta["histopipe"].update(step=f.step, index=f.index, deferrals=f.passed, weight_version=f.weight_version)
        return final

    def _in_flight(self, now: float, indices: Sequence[int]) -> list[InFlight]:
        """The requests of ``indices`` that decode now (sent, not held back, no abort under way), as the rules
        of pipe/migration.py see them."""
        out = []
        for i in indices:
            f = self.flights[i]
            if self.results[i] is not None or f.target is not None or f.decoding is None:
                continue
            if i in self.held.get(f.backend, ()):
                continue
            done = len((f.head or {}).get("output_ids") or [])
            prompt = len(self.items[i].get("input_ids") or [])
            out.append(InFlight(i, f.backend, now - f.decoding, done, self.estimates[i], f.moved, f.deferrals, prompt))
        return out

    def _scan(self) -> None:
        """Defer (``defer``) or migrate the outliers the rules of pipe/migration.py pick."""
        if self.defer:
            waiting = [i for i in range(len(self.items)) if self.results[i] is None and i not in self.deferred]
            picks = pick_deferrals(
                self._in_flight(time.monotonic(), waiting),
                len(waiting),
                len(self.items),
                decode_rate(self.rates),
                self.router.planner.config,
                self.step_mean,
            )
            for i in picks:
                self.flights[i].deferrals += 1
                self.deferred.add(i)
            return
        self._migrations()

    def _migrations(self) -> None:
        """Abort the outliers the migration rule picks (their answers come back through ``_landed``)."""
        live = [b for b, backend in enumerate(self.router.backends) if backend.healthy]
        busy = {b for b, n in self.inflight.items() if n > 0} | {b for b, q in self.held.items() if q}
        busy |= {f.target for f in self.flights.values() if f.target is not None}
        idle = [b for b in live if b not in busy]
        if not idle:
            return
        flights = self._in_flight(time.monotonic(), list(self.flights))
        unfinished = sum(r is None for r in self.results)
        picks = pick_migrations(
            flights, unfinished, len(self.items), idle, decode_rate(self.rates), self.router.planner.config
        )
        for i, target in picks:
            f = self.flights[i]
            f.moved = True
            with self.router._lock:
                if f.base in self.router._aborted:
                    continue
            if self.router._abort(self.router.backends[f.backend], f.rid):
                f.target = target


def _joined(head: dict[str, Any] | None, tail: dict[str, Any]) -> dict[str, Any]:
    """An answer made of ``head`` (an aborted part, or None) followed by ``tail``."""
    if head is None:
        return dict(tail)
    out = dict(tail)
    meta = dict(tail.get("meta_info") or {})
    head_meta = head.get("meta_info") or {}
    out["output_ids"] = list(head.get("output_ids") or []) + list(tail.get("output_ids") or [])
    out["text"] = (head.get("text") or "") + (tail.get("text") or "")
    meta["completion_tokens"] = len(out["output_ids"])
    meta["prompt_tokens"] = meta.get("prompt_tokens", 0)
    if "output_token_logprobs" in head_meta or "output_token_logprobs" in meta:
        meta["output_token_logprobs"] = list(head_meta.get("output_token_logprobs") or []) + list(
            meta.get("output_token_logprobs") or []
        )
    for key in ("spec_verify_ct", "spec_draft_token_num", "spec_accept_token_num", "e2e_latency"):
        if isinstance(meta.get(key), (int, float)) and isinstance(head_meta.get(key), (int, float)):
            meta[key] = meta[key] + head_meta[key]
    out["meta_info"] = meta
    return out


def _dumps(body: Any) -> bytes:
    """JSON with non-ASCII escaped: encodes whatever the client sent."""
    return json.dumps(body, separators=(",", ":")).encode()


def item_prompt_id(item: dict[str, Any]) -> str | None:
    """The history key of one /generate item, by the servers' rule (``drafting/prompt_ids.py``); None for a
    ``text`` item without ``custom_params.prompt_id`` (the router has no tokenizer: such items get the prior).

    Example: ``item_prompt_id({"input_ids": [1, 2]}) == token_prompt_id([1, 2])``.
    """
    custom = (item.get("sampling_params") or {}).get("custom_params")
    ids = item.get("input_ids")
    return prompt_id_for(custom, ids) if ids else explicit_prompt_id(custom)


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
