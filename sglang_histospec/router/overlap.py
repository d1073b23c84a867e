"""One-step overlap in the router (:class:`Overlap`, opt-in, one step off-policy): a step call returns once the
requests the deferral rule leaves alone are answered; deferred ones keep running on their backends and come back
with the next step call (``carried``) or :meth:`Overlap.drain`. Example: :class:`Overlap`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from sglang_histospec.router.config import StepAnswers
from sglang_histospec.router.dispatch import Dispatcher
from sglang_histospec.router.flights import Flights


class Overlap:
    """The carried requests between step calls, one step call (or drain) at a time. Example::

        overlap = Overlap(dispatcher)
        answers = overlap.step(3, [("p0", [1, 5])], 4, {"max_new_tokens": 64})
        answers.deferred   # indices of step 3's requests still running; their answers come with step 4's call

    A carried request counts for the step that receives it (its tail, its deferral rule) and its backend's
    remaining work is the ``backlog`` of that step's plan. Each answer says the step it was submitted in and the
    weight version then (``meta_info.histopipe``). A step call that fails once dispatched (503, a backend's 4xx)
    also drops the earlier steps' deferred requests it had taken over: their answers are not returned by any later
    call.
    """

    def __init__(self, dispatch: Dispatcher) -> None:
        self.dispatch = dispatch
        self._carry: Flights | None = None  # the last step's requests still running
        self._lock = threading.Lock()

    def step(
        self,
        step: int,
        prompts: Sequence[tuple[str, list[int]]],
        group_size: int,
        sampling_params: dict[str, Any] | None = None,
        **options: Any,
    ) -> StepAnswers:
        """Run a step (``options``: :meth:`Dispatcher.plan_step`'s) and return without its deferred requests."""
        d = self.dispatch
        with self._lock:
            live = d.pool.live()
            carry = self._carry
            backlog = None if carry is None else carry.backlog([d.backends.index(b) for b in live])
            items, placement, predicted, estimates = d.plan_step(
                step, prompts, group_size, sampling_params, live, backlog, **options
            )
            self._carry = None  # the new step takes the carried requests over, or they are lost with it
            flights = Flights(d, items, predicted, estimates, step=step, carry=carry, defer=True)
            flights.run(placement)
            return self._deliver(step, flights)

    def drain(self) -> list[dict[str, Any]]:
        """Wait for every deferred request still running; their answers (``[]`` when none runs)."""
        with self._lock:
            carry, self._carry = self._carry, None
            if carry is None:
                return []
            flights = Flights(self.dispatch, [], [], [], step=carry.step, carry=carry, defer=False)
            flights.run({})
            return self._deliver(None, flights).carried

    def carried(self) -> int:
        """Deferred requests still running, to be answered with the next step call or drain."""
        carry = self._carry
        return 0 if carry is None else len(carry.pending())

    def _deliver(self, step: int | None, flights: Flights) -> StepAnswers:
        """Feed the predictor with what ``flights`` answered, keep what still runs for the next step call."""
        d = self.dispatch
        answers = flights.answers(step)
        landed = [(f.step, flights.items[i], flights.results[i]) for i, f in flights.flights.items()]
        with d.lock:
            for f_step, item, out in landed:
                if out is not None:
                    d.observe(f_step, item, out)
            if step is not None:
                d.steps += 1
        d.record(landed)
        self._carry = flights if flights.pending() else None
        return answers
