"""Per-request dispatch with outlier migration or, with one-step overlap, deferral (:class:`Flights`, one instance
per step call): each request goes out as its own ``/generate`` call, at most the cost model's ``max_running`` in
flight per backend, and while a step is in its tail the rules of ``pipe/migration.py`` pick the requests to move
to an idle backend (aborted, then resumed from prompt + the tokens they emitted, draws offset by their count) or
to defer (answered with a later step call). Example: :class:`Flights`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from sglang_histospec.pipe.lengths import LengthEstimate
from sglang_histospec.pipe.migration import InFlight, backlog_s, decode_rate, pick_deferrals, pick_migrations
from sglang_histospec.router.backends import BackendDown
from sglang_histospec.router.config import RouterError, StepAnswers
from sglang_histospec.router.dispatch import Dispatcher
from sglang_histospec.router.items import completion_tokens, joined
from sglang_histospec.server.schemas import DEFAULT_MAX_NEW_TOKENS


@dataclass(slots=True)
class Flight:
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


class Flights:
    """Per-request dispatch of one step call with outlier migration or, with ``defer``, deferral. Example::

        flights = Flights(dispatcher, items, predicted, estimates, step=3)
        results = flights.run(placement)   # every request answered once; outliers migrated on the way

    Each request goes out as one /generate call, at most the cost model's ``max_running`` in flight per backend
    (the rest are sent in plan order as slots free up, so none waits in a backend's queue). While a step is in its
    tail the dispatcher applies the simulator's rule (pipe/migration.py) every ``outlier_check_s``: a request
    estimated far past its prompt's history (tokens emitted = time since it was sent x the step's decode rate) is
    aborted on its backend (SGLang's ``POST /abort_request``, which the rollout server implements too) and its
    prompt plus the tokens it emitted go to an idle backend, with the same sampling params and
    ``custom_params.seed_offset`` = tokens emitted, so a seeded request continues with the draws it would have used
    (token-identical on the torch backend; SGLang samples the continuation afresh). The answer is the two parts
    joined; ``meta_info.histopipe.migrated_from`` names the first backend.

    With ``defer`` (one-step overlap) the deferral rule replaces migration: a request past its deferral threshold
    (``pick_deferrals``: ``outlier_factor``, ``max_deferrals``, ``DEFER_STEP_FACTOR["router"]``) is no longer
    waited for and :meth:`run` returns without it; it keeps running on its backend. Items ``[0, own)`` are the
    step's own; after them come the requests that ``carry`` (the previous step call's instance) deferred and that
    still run, taken over with their backend calls.
    """

    def __init__(
        self,
        d: Dispatcher,
        items: list[dict[str, Any]],
        predicted: list[float],
        estimates: list[LengthEstimate],
        step: int = 0,
        carry: Flights | None = None,
        defer: bool = False,
    ) -> None:
        self.d, self.items, self.predicted, self.estimates = d, list(items), list(predicted), list(estimates)
        self.step, self.own, self.defer = step, len(items), defer
        self.step_mean = sum(predicted) / len(predicted) if predicted else 0.0  # = the plan's mean_predicted()
        self.results: list[dict[str, Any] | None] = [None] * len(items)
        self.flights: dict[int, Flight] = {}
        self.running: dict[Future, int] = {}
        self.rates: list[tuple[int, float]] = []
        self.tag = uuid.uuid4().hex[:12]
        self.held: dict[int, deque[int]] = {}  # per backend, requests not sent yet, in plan order
        self.inflight: dict[int, int] = {}
        self.deferred: set[int] = set()  # requests this step call no longer waits for
        self.cap = d.planner.cost.config.max_running
        if carry is not None:
            self._adopt(carry)

    def _adopt(self, carry: Flights) -> None:
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
        return backlog_s(flights, len(backends), decode_rate(self.rates), self.d.planner.cost)

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
                done, _ = wait(list(self.running), timeout=self.d.config.outlier_check_s, return_when=FIRST_COMPLETED)
                if self.d.pool.stop.is_set():  # begin_shutdown: fail the step now, wait for no backend
                    raise RouterError(503, "the router is shutting down")
                for fut in done:
                    self._landed(self.running.pop(fut), fut)
                self._scan()
            ok = True
        finally:
            with self.d.lock:
                for i, f in self.flights.items():
                    if not ok or self.results[i] is not None:  # a request still running keeps its rid mapping
                        self.d.current_rids.pop(f.base, None)
                        self.d.aborted.discard(f.base)
        for i in self.pending():
            f = self.flights[i]
            f.passed += 1
            self.d.backends[f.backend].count("deferred")
            with self.d.lock:
                self.d.deferred += 1
        assert self.defer or not self.pending(), "a request was lost"
        return self.results

    def _submit(self, i: int, b: int, item: dict[str, Any]) -> None:
        backend = self.d.backends[b]
        f = self.flights.get(i)
        if f is None:
            rid = item.get("rid") or f"hp-{self.tag}-{i}"
            version = self.d.weight_version
            f = self.flights[i] = Flight(
                b, rid, time.monotonic(), rid, step=self.step, index=i, weight_version=version
            )
        else:
            f.backend, f.started, f.decoding, f.attempts = b, time.monotonic(), None, f.attempts + 1
            f.rid = f"{f.base}~{f.attempts}"
        with self.d.lock:
            backend.outstanding += self.predicted[i]
            self.d.current_rids[f.base] = f.rid
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
            self.running[self.d.calls.submit(self.d.pool.post_generate, self.d.backends[b], [f.body])] = i

    def _landed(self, i: int, fut: Future) -> None:
        f = self.flights[i]
        backend = self.d.backends[f.backend]
        with self.d.lock:
            backend.outstanding -= self.predicted[i]
        self.inflight[f.backend] -= 1
        self._pump(f.backend)
        try:
            outs = fut.result()
        except BackendDown:
            self.d.pool.down(backend)
            backend.count("failed_requests")
            f.target = None
            attempts = [0] * len(self.items)
            attempts[i] = f.attempts
            for b, _ in self.d.replace([i], attempts, self.predicted, exclude=f.backend).items():
                self.d.backends[b].count("resubmitted_in")
                self._submit(i, b, self._continuation(i, f))
            return
        if len(outs) != 1:
            raise RouterError(502, f"{backend.url} answered {len(outs)} items for 1 request")
        [out] = outs
        meta = out.get("meta_info") or {}
        if "server_received" in meta:
            f.intervals.append([backend.url, meta["server_received"], meta["server_answered"]])
        with self.d.lock:
            aborted = f.base in self.d.aborted  # its client went away: its answer is the aborted part
        if f.target is not None and not aborted and (meta.get("finish_reason") or {}).get("type") == "abort":
            self._migrate(i, f, out)
            return
        f.target = None  # it finished before the abort landed: nothing to migrate
        self.rates.append((completion_tokens(out), time.monotonic() - (f.decoding or f.started)))
        assert self.results[i] is None, "a request was answered twice"
        self.results[i] = self._join(f, out)
        backend.count("requests")
        backend.count("completion_tokens", completion_tokens(out))

    def _migrate(self, i: int, f: Flight, out: dict[str, Any]) -> None:
        """The abort landed: resume the request on its target with the tokens it emitted."""
        source, target = self.d.backends[f.backend], f.target
        assert target is not None
        f.head = joined(f.head, out)
        f.sources.append(source.url)
        f.target = None
        source.count("migrated_out")
        self.d.backends[target].count("migrated_in")
        with self.d.lock:
            self.d.migrations += 1
        self._submit(i, target, self._continuation(i, f))

    def _continuation(self, i: int, f: Flight) -> dict[str, Any]:
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

    def _join(self, f: Flight, out: dict[str, Any]) -> dict[str, Any]:
        final = joined(f.head, out)
        meta = final.setdefault("meta_info", {})
        if f.head is not None:
            meta["prompt_tokens"] = meta.get("prompt_tokens", 0) - len(f.head.get("output_ids") or [])
        if f.attempts > 1 and "id" in meta:
            meta["id"] = f.base  # the rid the client knows, not that of the resubmission
        meta["histopipe"] = {
            "backend": self.d.backends[f.backend].url,
            "attempts": f.attempts,
            "migrated_from": f.sources,
            "intervals": f.intervals,
        }
        if self.d.config.overlap:
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
                self.d.planner.config,
                self.step_mean,
            )
            for i in picks:
                self.flights[i].deferrals += 1
                self.deferred.add(i)
            return
        self._migrations()

    def _migrations(self) -> None:
        """Abort the outliers the migration rule picks (their answers come back through ``_landed``)."""
        live = [b for b, backend in enumerate(self.d.backends) if backend.healthy]
        busy = {b for b, n in self.inflight.items() if n > 0} | {b for b, q in self.held.items() if q}
        busy |= {f.target for f in self.flights.values() if f.target is not None}
        idle = [b for b in live if b not in busy]
        if not idle:
            return
        flights = self._in_flight(time.monotonic(), list(self.flights))
        unfinished = sum(r is None for r in self.results)
        picks = pick_migrations(
            flights, unfinished, len(self.items), idle, decode_rate(self.rates), self.d.planner.config
        )
        for i, target in picks:
            f = self.flights[i]
            f.moved = True
            with self.d.lock:
                if f.base in self.d.aborted:
                    continue
            if self.d.pool.abort_one(self.d.backends[f.backend], f.rid):
                f.target = target
