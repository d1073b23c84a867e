"""Placing and sending a step's or a /generate body's requests (:class:`Dispatcher`): the step's plan turned into
items and a placement, per-prompt placement of plain /generate items, batched dispatch with resubmission of a
failed backend's requests, and the state the per-request dispatch (``router/flights.py``) shares with it: the
lock, the client's rids, the counters. Example: :class:`Dispatcher`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from sglang_histospec.pipe.lengths import LengthEstimate, LengthPredictor
from sglang_histospec.pipe.planner import Group, Planner
from sglang_histospec.router.backends import Backend, BackendDown, BackendPool
from sglang_histospec.router.config import SHUTDOWN_POLL_S, RouterConfig, RouterError
from sglang_histospec.router.items import completion_tokens, item_prompt_id
from sglang_histospec.router.trace_log import RouterTrace

StepItems = tuple[list[dict[str, Any]], dict[int, list[int]], list[float], list[LengthEstimate]]
"""A planned step: its items, placement (backend index -> item indices), predicted lengths and estimates."""


def least_loaded(indices: Sequence[int], predicted: Sequence[float], load: dict[int, float]) -> dict[int, list[int]]:
    """Longest predicted first, each index to the backend of ``load`` (index -> predicted work, updated) with the
    least work. Example: ``least_loaded([0, 1], [5.0, 3.0], {0: 0.0, 1: 1.0}) == {0: [0], 1: [1]}``."""
    placement: dict[int, list[int]] = {}
    for i in sorted(indices, key=lambda i: -predicted[i]):
        target = min(load, key=lambda k: (load[k], k))
        placement.setdefault(target, []).append(i)
        load[target] += predicted[i]
    return placement


class Dispatcher:
    """Plans, places and sends requests over a :class:`BackendPool`. Example::

        d = Dispatcher(config, pool, Planner(), LengthPredictor())
        items, placement, predicted, estimates = d.plan_step(0, [("p0", [1, 5])], 4, None, pool.live())
        results = d.batched(items, placement, predicted)   # one batched /generate per backend

    A backend whose batched call fails is marked down and the requests of that call go to the other healthy
    backends (least predicted work first): a batched call returns all its answers or none, so every request is
    answered exactly once. ``lock`` guards the predictor, the planner, the backends' ``outstanding`` work and the
    counters; the per-request dispatch (``router/flights.py``) uses it and ``current_rids`` / ``aborted`` too.
    """

    def __init__(self, config: RouterConfig, pool: BackendPool, planner: Planner, predictor: LengthPredictor) -> None:
        self.config, self.pool, self.planner, self.predictor = config, pool, planner, predictor
        self.lock = threading.Lock()
        self.calls = ThreadPoolExecutor(max_workers=config.max_inflight, thread_name_prefix="router-call")
        self.current_rids: dict[str, str] = {}  # rid a client knows -> rid of its running resubmission
        self.aborted: set[str] = set()  # rids a client aborted while they ran (not migrated any more)
        self.migrations = 0
        self.deferred = 0  # requests a step call returned without (answered with a later call)
        self.steps = 0
        self.weight_version: str | None = None  # the last weight_version sent through update_weights
        self.trace = RouterTrace(config.trace_path) if config.trace_path else None

    def record(self, answers: list[tuple[int, dict[str, Any], dict[str, Any] | None]]) -> None:
        """Append (step, item, answer) of one call to the trace, when there is one (call outside ``lock``)."""
        if self.trace is not None:
            self.trace.append(answers)

    @property
    def backends(self) -> list[Backend]:
        return self.pool.backends

    def close(self) -> None:
        self.calls.shutdown(wait=False, cancel_futures=True)

    # ---- planning ----------------------------------------------------------------------------------------
    def plan_step(
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
    ) -> StepItems:
        """A step's items, placement (backend index -> item indices), predicted lengths and estimates."""
        if not isinstance(group_size, int) or group_size < 1:
            raise RouterError(400, f"group_size: must be an int >= 1, got {group_size!r}", "group_size")
        if not prompts:
            raise RouterError(400, "prompts: empty step", "prompts")
        n = len(prompts) * group_size
        if item_params is not None and len(item_params) != n:
            raise RouterError(400, f"item_params has {len(item_params)} entries for {n} requests")
        groups = [Group(pid, group_size, len(ids)) for pid, ids in prompts]
        with self.lock:
            plan = self.planner.plan(
                step, groups, len(live), self.predictor, backlog=backlog, overlap=self.config.overlap
            )
        items = []
        for i in range(n):
            pid, ids = prompts[i // group_size]
            sp = {**(sampling_params or {}), **(item_params[i] if item_params is not None else {})}
            sp["custom_params"] = {**sp.get("custom_params", {}), "prompt_id": pid}
            rid = rids[i] if rids is not None else uuid.uuid4().hex
            items.append({"input_ids": list(ids), "sampling_params": sp, "return_logprob": return_logprob, "rid": rid})
        placement = {
            self.backends.index(live[w]): [g * group_size + s for g, s in reqs] for w, reqs in enumerate(plan.workers)
        }
        predicted = [plan.predicted_lengths[i // group_size] for i in range(n)]
        with self.lock:
            estimates = [self.predictor.predict(pid) for pid, _ in prompts for _ in range(group_size)]
        return items, placement, predicted, estimates

    def place_items(self, items: list[dict[str, Any]], counts: list[int]) -> tuple[dict[int, list[int]], list[float]]:
        """Plain /generate items (item i with ``counts[i]`` samples) on the backends with the least outstanding
        predicted work, longest first: (placement, predicted tokens per item)."""
        predicted = []
        for item, count in zip(items, counts):
            pid = item_prompt_id(item)
            mean = self.predictor.predict(pid).mean if pid is not None else self.predictor.prior().mean
            predicted.append(mean * count)
        with self.lock:
            load = {self.backends.index(b): b.outstanding for b in self.pool.live()}
            return least_loaded(range(len(items)), predicted, load), predicted

    def observe(self, step: int, item: dict[str, Any], out: dict[str, Any]) -> None:
        """Feed the length predictor with one answer (call under ``lock``)."""
        pid = item_prompt_id(item)
        if pid is not None:
            self.predictor.observe(pid, max(0, step), completion_tokens(out))

    # ---- batched dispatch --------------------------------------------------------------------------------
    def batched(
        self,
        items: list[dict[str, Any]],
        placement: dict[int, list[int]],
        predicted: list[float],
        counts: list[int] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Run ``placement`` (backend index -> item indices) as one call per backend; resubmit the items of failed
        calls elsewhere. Item i is answered by ``counts[i]`` outputs (its ``n`` samples)."""
        counts = counts or [1] * len(items)
        results: list[list[dict[str, Any]] | None] = [None] * len(items)
        attempts = [0] * len(items)
        running: dict[Future, tuple[int, list[int]]] = {}

        def submit(b: int, idx: list[int]) -> None:
            backend = self.backends[b]
            with self.lock:
                backend.outstanding += sum(predicted[i] for i in idx)
            for i in idx:
                attempts[i] += 1
            running[self.pool.submit(self.pool.post_generate, backend, [items[i] for i in idx])] = (b, idx)

        for b, idx in placement.items():
            if idx:
                submit(b, idx)
        while running:
            done, _ = wait(list(running), timeout=SHUTDOWN_POLL_S, return_when=FIRST_COMPLETED)
            if self.pool.stop.is_set():  # begin_shutdown: fail the call now, wait for no backend
                raise RouterError(503, "the router is shutting down")
            for fut in done:
                b, idx = running.pop(fut)
                backend = self.backends[b]
                with self.lock:
                    backend.outstanding -= sum(predicted[i] for i in idx)
                try:
                    outs = fut.result()
                except BackendDown:
                    self.pool.down(backend)
                    backend.count("failed_requests", len(idx))
                    for nb, chunk in self.replace(idx, attempts, predicted, exclude=b).items():
                        self.backends[nb].count("resubmitted_in", len(chunk))
                        submit(nb, chunk)
                    continue
                self._answered(backend, idx, outs, counts, attempts, results)
        assert all(r is not None for r in results), "a request was lost"
        return results  # type: ignore[return-value]

    @staticmethod
    def _answered(
        backend: Backend,
        idx: list[int],
        outs: list[dict[str, Any]],
        counts: list[int],
        attempts: list[int],
        results: list[list[dict[str, Any]] | None],
    ) -> None:
        """Hand a batched call's ``outs`` to its items ``idx`` (``counts[i]`` each), tagged with the backend."""
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
        backend.count("completion_tokens", sum(completion_tokens(o) for o in outs))

    def replace(
        self, idx: list[int], attempts: list[int], predicted: list[float], exclude: int
    ) -> dict[int, list[int]]:
        """New backends (least outstanding work first) for the requests of a failed call."""
        if self.pool.stop.is_set():
            raise RouterError(503, "the router is shutting down")
        over = [i for i in idx if attempts[i] >= self.config.max_attempts]
        if over:
            raise RouterError(503, f"requests {over[:5]} failed on {self.config.max_attempts} backends")
        with self.lock:
            live = [self.backends.index(b) for b in self.pool.healthy() if self.backends.index(b) != exclude]
            if not live:
                raise RouterError(503, "every backend failed during the step")
            return least_loaded(idx, predicted, {b: self.backends[b].outstanding for b in live})

    def abort(self, rids: list[str]) -> None:
        """Abort these requests on every backend (a client that went away); best effort. A request of a step
        that was migrated or resubmitted is aborted under its current rid too, and is not migrated again."""
        if not rids:
            return
        with self.lock:
            self.aborted.update(r for r in rids if r in self.current_rids)
            rids = list(rids) + [self.current_rids[r] for r in rids if self.current_rids.get(r, r) != r]
        self.pool.abort_everywhere(rids)
