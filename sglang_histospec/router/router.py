"""The HistoPipe router (no HTTP server here; ``router/app.py`` puts routes on it): :class:`Router` composes the
rollout servers (``router/backends.py``), the dispatcher (``router/dispatch.py``: planning, placement, batched
dispatch; ``router/flights.py``: per-request dispatch with migration or deferral) and one-step overlap
(``router/overlap.py``). The HTTP API: docs/serving.md, "HistoPipe: balancing rollout workers". Example:
:class:`Router`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sglang_histospec.pipe.lengths import LengthPredictor, LengthPredictorConfig
from sglang_histospec.pipe.planner import Planner, PlannerConfig
from sglang_histospec.pipe.worker_cost import CostModel
from sglang_histospec.router.backends import Backend, BackendPool
from sglang_histospec.router.config import RouterConfig, RouterError, StepAnswers
from sglang_histospec.router.dispatch import Dispatcher
from sglang_histospec.router.flights import Flights
from sglang_histospec.router.items import dumps, is_batch, split_generate_body
from sglang_histospec.router.metrics import metrics_text, sum_stats
from sglang_histospec.router.overlap import Overlap
from sglang_histospec.router.trace_log import plain_step
from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import (
    GenerateBody,
    HistoryPushBody,
    RequestLimits,
    StepBody,
    check_generate_body,
    check_generate_for_model,
    item_rids,
    sample_rid,
    step_to_generate_body,
    to_history_entries,
)


class Router:
    """One router over the rollout servers: places, dispatches, resubmits, migrates or defers. Example::

    router = Router(RouterConfig(backends=["http://127.0.0.1:30001", "http://127.0.0.1:30002"]))
    results = router.run_step(0, [("p0", [1, 5, 7]), ("p1", [1, 9])], group_size=4,
                              sampling_params={"max_new_tokens": 32, "temperature": 1.0})
    len(results)  # 8: prompt i, sample j at index i * 4 + j

    It holds the backends (:class:`BackendPool`), a :class:`LengthPredictor` fed by every response and history
    push, and a :class:`Planner`. A step (``run_step``) is planned across the healthy backends; with
    ``migrate_outliers`` (the default) each request is its own /generate call and running outliers migrate to an
    idle backend (:class:`Flights`), else one batched call per backend goes out (:meth:`Dispatcher.batched`). A
    backend whose call fails is marked down and its requests are resubmitted to the others, each answered exactly
    once. Plain ``/generate`` bodies are split per item and placed per prompt (the servers' prompt id,
    :func:`item_prompt_id`) on the backend with the least outstanding predicted work, in batched calls.
    One-step overlap (``overlap``, opt-in; :meth:`overlap_step`): outliers are deferred instead (:class:`Overlap`).
    """

    def __init__(self, config: RouterConfig, cost: CostModel | None = None) -> None:
        self.config = config
        self.pool = BackendPool(config)
        self.predictor = LengthPredictor(LengthPredictorConfig(window=2))
        self.planner = Planner(cost or CostModel(), config.planner or PlannerConfig(policy=config.policy))
        self.dispatch = Dispatcher(config, self.pool, self.planner, self.predictor)
        self.overlap = Overlap(self.dispatch)
        self._model_limits: ModelLimits | None = None

    # ---- state the dispatcher keeps, read here ----------------------------------------------------------
    @property
    def backends(self) -> list[Backend]:
        return self.pool.backends

    @property
    def migrations(self) -> int:
        return self.dispatch.migrations

    @property
    def deferred(self) -> int:
        """Requests a step call returned without (answered with a later call)."""
        return self.dispatch.deferred

    @property
    def steps(self) -> int:
        return self.dispatch.steps

    @property
    def weight_version(self) -> str | None:
        """The last ``weight_version`` sent through :meth:`update_weights`."""
        return self.dispatch.weight_version

    @property
    def _current_rids(self) -> dict[str, str]:
        return self.dispatch.current_rids

    @property
    def _aborted(self) -> set[str]:
        return self.dispatch.aborted

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.pool.start()

    def begin_shutdown(self) -> None:
        """Stop taking requests and fail the running backend calls now (SIGTERM: answers go out, nothing waits
        for the backends)."""
        self.pool.begin_shutdown()

    def close(self) -> None:
        self.pool.stop.set()
        self.dispatch.close()
        self.pool.close()
        if self.dispatch.trace is not None:
            self.dispatch.trace.close()

    def check_health(self) -> list[bool]:
        return self.pool.check_health()

    def add_backend(self, url: str) -> dict[str, Any]:
        """:meth:`BackendPool.add`: routed to once healthy and replayed; ValueError for a bad or known URL."""
        return self.pool.add(url)

    def health(self) -> tuple[int, dict[str, Any]]:
        return self.pool.health()

    def healthy(self) -> list[Backend]:
        return self.pool.healthy()

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
        """The server's validation of a /generate body, with the server's functions: all of it for ``input_ids``
        bodies once the model is known, all but the model checks for ``text`` (the backend tokenizes and checks)."""
        check_generate_body(body, limits or self.config.limits)
        model = self.model_limits()
        if body.text is None and model is not None:
            check_generate_for_model(body, model)

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
        d = self.dispatch
        options = {"return_logprob": return_logprob, "rids": rids, "item_params": item_params}
        items, placement, predicted, estimates = d.plan_step(
            step, prompts, group_size, sampling_params, self.pool.live(), **options
        )
        if self.config.migrate_outliers:
            results = Flights(d, items, predicted, estimates).run(placement)
        else:
            results = [outs[0] for outs in d.batched(items, placement, predicted)]
        with d.lock:
            for item, out in zip(items, results):
                d.observe(step, item, out)
            d.steps += 1
        d.record([(step, item, out) for item, out in zip(items, results)])
        return results  # type: ignore[return-value]

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
        answer is in step 4's ``carried``, with ``meta_info.histopipe.step == 3``. Rules: :class:`Overlap`.
        """
        if not self.config.overlap:
            raise RouterError(409, "RouterConfig.overlap is off: call run_step")
        return self.overlap.step(step, prompts, group_size, sampling_params, **options)

    def drain(self) -> list[dict[str, Any]]:
        """With ``overlap``: wait for every deferred request still running and return their answers (as in
        :attr:`StepAnswers.carried`); ``[]`` when none runs. Call it after the last step."""
        return self.overlap.drain()

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
        batch = is_batch(raw)
        raw["rid"] = rids if batch else rids[0]
        items, _ = split_generate_body(raw)
        counts = [int((item.get("sampling_params") or {}).get("n", 1)) for item in items]
        if on_rids is not None:
            on_rids([sample_rid(r, j, c) or "" for r, c in zip(rids, counts) for j in range(c)])
        d = self.dispatch
        placement, predicted = d.place_items(items, counts)
        grouped = d.batched(items, placement, predicted, counts)
        with d.lock:
            for item, outs in zip(items, grouped):
                for out in outs:
                    d.observe(d.steps, item, out)
            step = plain_step(d.weight_version, d.steps)
        d.record([(step, item, out) for item, outs in zip(items, grouped) for out in outs])
        flat = [out for outs in grouped for out in outs]
        return flat if batch or len(flat) > 1 else flat[0]

    def abort(self, rids: list[str]) -> None:
        """:meth:`Dispatcher.abort`: these requests, under their current rids, on every backend (best effort)."""
        self.dispatch.abort(rids)

    # ---- history and admin fan-out -----------------------------------------------------------------------
    def push_history(self, body: HistoryPushBody | dict[str, Any]) -> dict[str, Any]:
        """Validate a history push as a server would, send it to every healthy backend, and only then let the
        lengths feed the predictor (a push the backends refuse changes nothing here).
        Example: ``router.push_history({"step": 3, "entries": [{"prompt_id": "p0", "responses": [[5, 9]]}]})``."""
        if not isinstance(body, HistoryPushBody):
            body = HistoryPushBody.model_validate(body)
        checked = to_history_entries(body, self.model_limits(), self.config.limits)
        content = dumps(body.model_dump(exclude_unset=True))
        with self.pool.push_lock:  # kept for replay once every healthy backend took it
            answers = self.pool.fan_out("/histospec/history", content)
            self.pool.pushes.record(int(body.step), content)
        with self.dispatch.lock:
            for e in checked:
                lengths = [len(r) for r in e.responses if r]
                if lengths:
                    self.predictor.add(e.prompt_id, int(body.step), lengths)
        done = [a["accepted"] for a in answers.values() if isinstance(a, dict) and "accepted" in a]
        return {"accepted": min(done), "backends": answers}

    def end_step(self, step: int | None) -> dict[str, Any]:
        return {"success": True, "backends": self.pool.fan_out("/histospec/end_step", {"step": step})}

    def update_weights(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Fan a weight update out to every healthy backend; remembered, so a backend that comes back loads it."""
        answers = self.pool.fan_out("/update_weights_from_disk", raw)
        self.pool.weights = dict(raw)
        if raw.get("weight_version") is not None:
            self.dispatch.weight_version = str(raw["weight_version"])
        messages = {a.get("message") for a in answers.values() if isinstance(a, dict)}
        message = messages.pop() if len(messages) == 1 else "Succeeded to update model weights."
        return {"success": True, "message": message, "num_paused_requests": 0, "backends": answers}

    def flush_cache(self) -> str:
        answers = self.pool.fan_out("/flush_cache", None, parse=False)
        texts = {a for a in answers.values() if isinstance(a, str)}
        return texts.pop() if len(texts) == 1 else "Cache flushed."

    def backend_get(self, path: str) -> Any:
        """GET ``path`` from a healthy backend (model info: every backend serves the same model)."""
        return self.pool.get(path)

    def fan_out_raw(self, path: str, body: Any) -> dict[str, Any]:
        """POST ``body`` to every healthy backend (:meth:`BackendPool.fan_out`); per-backend answers."""
        return self.pool.fan_out(path, body)

    # ---- observability -----------------------------------------------------------------------------------
    def carried(self) -> int:
        """With overlap: deferred requests still running, to be answered with the next step call or drain."""
        return self.overlap.carried()

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy,
            "steps": self.steps,
            "migrations": self.migrations,
            "deferred": self.deferred,
            "carried": self.carried(),
            "prompts_with_history": len(self.predictor),
            "trace": None if (t := self.dispatch.trace) is None else {"records": t.appender.count, "errors": t.errors},
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
        return {**sum_stats(per_backend), "per_backend": per_backend, "router": self.stats()}

    def metrics_text(self) -> str:
        totals = {"steps": self.steps, "migrations": self.migrations, "deferred": self.deferred}
        return metrics_text(self.backends, {**totals, "carried": self.carried()})
