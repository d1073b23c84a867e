"""Discrete-event model of one continuous-batching rollout worker, driven by :class:`CostModel`.

The worker's clock moves from one batch change to the next in closed form (:meth:`CostModel.span_time`), so a
step of thousands of requests costs one event per request, not one per token. The worker counts its decode
iterations; a running request remembers the iteration it joined at and the one it will finish at (a heap
gives the next finish), so an event costs O(log running).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sglang_histospec.pipe.worker_cost import CostModel


@dataclass(slots=True)
class _Running:
    prompt_len: int
    length: int  # tokens this submission must emit
    start_iter: int  # the worker's iteration count when it joined
    end_iter: int  # ... when it finishes


class WorkerSim:
    """One worker: a FIFO queue feeding a batch of at most ``max_running`` requests.

    ``now`` is the time of the worker's last iteration boundary; ``busy_s`` counts the time it spent with at least
    one request running or prefilling. Idle gaps are not busy: a worker that is idle when a request arrives
    starts at the arrival time. A running request's context is its prompt plus ``tau`` tokens per iteration.

    Example (1 s per iteration, nothing else costs)::

        w = WorkerSim(CostModel(CostModelConfig(iteration_s=1, per_request_s=0, per_context_token_s=0,
                                                prefill_token_s=0)))
        w.submit("a", prompt_len=0, length=3, at=0.0); w.submit("b", prompt_len=0, length=5, at=0.0)
        w.advance(math.inf)  # -> [("a", 3.0), ("b", 5.0)]
    """

    def __init__(self, cost: CostModel, start: float = 0.0) -> None:
        self.cost = cost
        self.now = float(start)
        self.busy_s = 0.0
        self.running: dict[Hashable, _Running] = {}
        self.queue: deque[tuple[Hashable, int, int]] = deque()
        self._iter = 0  # decode iterations run so far
        self._ends: list[tuple[int, int, Hashable]] = []  # heap of (end_iter, seq, key); stale entries skipped
        self._seq = 0
        self._prompt_sum = 0  # sum of the running requests' prompt lengths
        self._start_sum = 0  # sum of their start_iter

    # ---- state -----------------------------------------------------------------------------------------------
    def is_idle(self) -> bool:
        return not self.running and not self.queue

    def __contains__(self, key: Hashable) -> bool:
        return key in self.running or any(k == key for k, _, _ in self.queue)

    def generated(self, key: Hashable) -> int:
        """Tokens emitted so far by ``key`` in this submission (0 while queued)."""
        run = self.running.get(key)
        if run is None:
            if key in self:
                return 0
            raise ValueError(f"request {key!r} is not on this worker")
        return int(min(run.length, (self._iter - run.start_iter) * self.cost.config.tau))

    def generated_at(self, key: Hashable, t: float) -> int:
        """Tokens ``key`` will have emitted by time ``t`` if the batch does not change before then."""
        run = self.running.get(key)
        if run is None:
            return self.generated(key)
        k = self.cost.iterations_within(len(self.running), self._context(), t - self.now, self._next_k())
        return int(min(run.length, (self._iter + k - run.start_iter) * self.cost.config.tau))

    def time_when(self, key: Hashable, tokens: int) -> float:
        """When running ``key`` will have emitted ``tokens`` in this submission, if the batch does not change first.

        Returns :meth:`next_finish` when the batch changes before that (ask again then).
        """
        run = self.running[key]
        k = max(0, math.ceil(tokens / self.cost.config.tau - 1e-9) - (self._iter - run.start_iter))
        k_min = self._next_k()
        if k >= k_min:
            return self.next_finish()
        return self.now + self.cost.span_time(len(self.running), self._context(), k)

    def next_finish(self) -> float:
        """Time at which the next running request finishes if nothing else changes (inf when idle)."""
        if not self.running:
            return math.inf
        return self.now + self.cost.span_time(len(self.running), self._context(), self._next_k())

    # ---- changes ---------------------------------------------------------------------------------------------
    def submit(self, key: Hashable, prompt_len: int, length: int, at: float) -> None:
        """Queue a request that arrives at time ``at`` (the worker must not be past ``at``)."""
        if length < 1 or prompt_len < 0:
            raise ValueError(f"request {key!r}: length={length} must be >= 1 and prompt_len={prompt_len} >= 0")
        if key in self:
            raise ValueError(f"request {key!r} is already on this worker")
        if self.is_idle():
            self.now = max(self.now, at)
        self.queue.append((key, int(prompt_len), int(length)))
        self._admit()

    def remove(self, key: Hashable) -> int:
        """Take ``key`` off the worker (abort); returns the tokens it had emitted."""
        if key in self.running:
            done = self.generated(key)
            self._drop(key)
            self._admit()
            return done
        for i, (k, _, _) in enumerate(self.queue):
            if k == key:
                del self.queue[i]
                return 0
        raise ValueError(f"request {key!r} is not on this worker")

    def advance(self, until: float) -> list[tuple[Hashable, float]]:
        """Run whole iterations that end by ``until``; returns ``(key, finish_time)`` of requests that finished."""
        finished: list[tuple[Hashable, float]] = []
        while self.running:
            k_min = self._next_k()
            n, ctx = len(self.running), self._context()
            span = self.cost.span_time(n, ctx, k_min)
            if self.now + span > until:
                k = self.cost.iterations_within(n, ctx, until - self.now, k_min - 1)
                self._run(k, self.cost.span_time(n, ctx, k))
                break
            self._run(k_min, span)
            while self._ends and self._ends[0][0] <= self._iter:
                end, _, key = heapq.heappop(self._ends)
                run = self.running.get(key)
                if run is not None and run.end_iter == end:
                    self._drop(key)
                    finished.append((key, self.now))
            self._admit()
        return finished

    def drain_time(self, remaining: Callable[[Hashable, int], int]) -> float:
        """Predicted time from ``now`` until the worker is empty, given a predicted ``remaining(key, generated)``.

        Runs a copy of the worker in which every running request emits ``remaining(key, generated)`` more tokens
        (at least 1) and queued ones ``remaining(key, 0)``.
        """
        twin = WorkerSim(self.cost, self.now)
        tau = self.cost.config.tau
        for key, run in self.running.items():
            done = self.generated(key)
            context = run.prompt_len + (self._iter - run.start_iter) * tau
            twin._join(key, int(context), max(1, int(remaining(key, done))))
        for key, prompt_len, _ in self.queue:
            twin.queue.append((key, prompt_len, max(1, int(remaining(key, 0)))))
        twin._admit()
        twin.advance(math.inf)
        return twin.now - self.now

    # ---- internals -------------------------------------------------------------------------------------------
    def _next_k(self) -> int:
        while self._ends:
            end, _, key = self._ends[0]
            run = self.running.get(key)
            if run is not None and run.end_iter == end:
                return end - self._iter
            heapq.heappop(self._ends)  # stale: removed or resubmitted
        raise AssertionError("running requests without a finish entry")

    def _context(self) -> float:
        return self._prompt_sum + self.cost.config.tau * (len(self.running) * self._iter - self._start_sum)

    def _run(self, k: int, span: float) -> None:
        if k <= 0:
            return
        self.now += span
        self.busy_s += span
        self._iter += k

    def _join(self, key: Hashable, prompt_len: int, length: int) -> None:
        run = _Running(prompt_len, length, self._iter, self._iter + self.cost.iterations(length))
        self.running[key] = run
        self._prompt_sum += prompt_len
        self._start_sum += run.start_iter
        self._seq += 1
        heapq.heappush(self._ends, (run.end_iter, self._seq, key))

    def _drop(self, key: Hashable) -> None:
        run = self.running.pop(key)
        self._prompt_sum -= run.prompt_len
        self._start_sum -= run.start_iter

    def _admit(self) -> None:
        while self.queue and len(self.running) < self.cost.config.max_running:
            key, prompt_len, length = self.queue.popleft()
            prefill = self.cost.prefill_time(prompt_len)
            self.now += prefill
            self.busy_s += prefill
            self._join(key, prompt_len, length)
