"""Discrete-event model of one continuous-batching rollout worker, driven by :class:`CostModel`.

The worker's clock moves from one batch change to the next in closed form (:meth:`CostModel.span_time`), so a
step of thousands of requests costs one event per request, not one per token.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sglang_histospec.core.costmodel import CostModel


@dataclass(slots=True)
class _Running:
    prompt_len: int
    length: int  # tokens this submission must emit
    iters_left: int
    iters_done: int = 0

    def context(self, tau: float) -> float:
        return self.prompt_len + min(self.length, self.iters_done * tau)


class WorkerSim:
    """One worker: a FIFO queue feeding a batch of at most ``max_running`` requests.

    ``now`` is the time of the worker's last iteration boundary; ``busy_s`` counts the time it spent with at least
    one request running or prefilling. Idle gaps are not busy: a worker that is idle when a request arrives
    starts at the arrival time.

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
        return int(min(run.length, run.iters_done * self.cost.config.tau))

    def next_finish(self) -> float:
        """Time at which the next running request finishes if nothing else changes (inf when idle)."""
        if not self.running:
            return math.inf
        k = min(r.iters_left for r in self.running.values())
        return self.now + self.cost.span_time(len(self.running), self._context(), k)

    # ---- changes ---------------------------------------------------------------------------------------------
    def submit(self, key: Hashable, prompt_len: int, length: int, at: float) -> None:
        """Queue a request that arrives at time ``at``; advance the worker to ``at`` first."""
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
            del self.running[key]
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
            k_min = min(r.iters_left for r in self.running.values())
            n, ctx = len(self.running), self._context()
            span = self.cost.span_time(n, ctx, k_min)
            if self.now + span > until:
                k = self.cost.iterations_within(n, ctx, until - self.now, k_min - 1)
                self._run(k, self.cost.span_time(n, ctx, k))
                break
            self._run(k_min, span)
            for key in [key for key, r in self.running.items() if r.iters_left == 0]:
                del self.running[key]
                finished.append((key, self.now))
            self._admit()
        return finished

    def drain_time(self, remaining: Callable[[Hashable, int], int]) -> float:
        """Predicted time from ``now`` until the worker is empty, given a predicted ``remaining(key, generated)``.

        Runs a copy of the worker in which every running request emits ``remaining(key, generated)`` more tokens
        (at least 1) and queued ones ``remaining(key, 0)``.
        """
        twin = WorkerSim(self.cost, self.now)
        for key, run in self.running.items():
            done = self.generated(key)
            twin.running[key] = _Running(
                prompt_len=int(run.context(self.cost.config.tau)),
                length=max(1, int(remaining(key, done))),
                iters_left=self.cost.iterations(max(1, int(remaining(key, done)))),
            )
        for key, prompt_len, _ in self.queue:
            twin.queue.append((key, prompt_len, max(1, int(remaining(key, 0)))))
        twin._admit()
        twin.advance(math.inf)
        return twin.now - self.now

    # ---- internals -------------------------------------------------------------------------------------------
    def _context(self) -> float:
        tau = self.cost.config.tau
        return sum(r.context(tau) for r in self.running.values())

    def _run(self, k: int, span: float) -> None:
        if k <= 0:
            return
        self.now += span
        self.busy_s += span
        for r in self.running.values():
            r.iters_left -= k
            r.iters_done += k

    def _admit(self) -> None:
        while self.queue and len(self.running) < self.cost.config.max_running:
            key, prompt_len, length = self.queue.popleft()
            prefill = self.cost.prefill_time(prompt_len)
            self.now += prefill
            self.busy_s += prefill
            self.running[key] = _Running(prompt_len, length, self.cost.iterations(length))
