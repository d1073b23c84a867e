"""Which running requests to migrate or defer, for a dispatcher that sees only elapsed time (pure; no HTTP).

The router estimates a running request's emitted tokens as ``elapsed x`` the step's median decode rate
(:func:`decode_rate`) and applies the simulator's rules: :func:`pick_migrations` (move to an idle worker) or, with
one-step overlap, :func:`pick_deferrals`; :func:`backlog_s` is what deferred requests still cost their workers.

Example::

    f = InFlight(key=7, worker=0, elapsed_s=3.0, done_tokens=0, estimate=LengthEstimate(100.0, {0.9: 120.0}, 8, True))
    pick_migrations([f], unfinished=1, total=16, idle_workers=[1], tokens_per_s=60.0, config=PlannerConfig())
    # [(7, 1)]: about 180 tokens emitted > max(1.5 x 100, 120)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sglang_histospec.pipe.lengths import LengthEstimate
from sglang_histospec.pipe.planner import (
    DEFER_STEP_FACTOR,
    PlannerConfig,
    defer_threshold,
    in_tail,
    outlier_threshold,
    remaining_length,
)
from sglang_histospec.pipe.worker_cost import CostModel


@dataclass(frozen=True, slots=True)
class InFlight:
    """A running request as the dispatcher sees it."""

    key: int
    worker: int
    elapsed_s: float
    """Seconds since its current submission started."""
    done_tokens: int
    """Tokens it carries from earlier submissions (0 unless it was migrated already)."""
    estimate: LengthEstimate
    moved: bool = False
    deferrals: int = 0
    """Times the deferral rule has passed it on to a later step."""
    prompt_tokens: int = 0
    """Its prompt's length (the context it decodes on), for :func:`backlog_s`."""

    def emitted(self, tokens_per_s: float | None) -> float:
        """Tokens it has emitted by the estimate (none counted from this submission without a rate)."""
        return self.done_tokens + (self.elapsed_s * tokens_per_s if tokens_per_s else 0.0)


def decode_rate(samples: Sequence[tuple[int, float]]) -> float | None:
    """Median tokens per second over ``(tokens, seconds)`` of finished requests; None without a usable sample.

    Example: ``decode_rate([(100, 2.0), (30, 1.0), (10, 0.0)]) == 40.0`` (the median of 50 and 30; 0 s is skipped).
    """
    rates = sorted(n / s for n, s in samples if s > 0 and n > 0)
    if not rates:
        return None
    mid = len(rates) // 2
    return rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2


def pick_migrations(
    flights: Sequence[InFlight],
    unfinished: int,
    total: int,
    idle_workers: Sequence[int],
    tokens_per_s: float | None,
    config: PlannerConfig,
) -> list[tuple[int, int]]:
    """``(key, target worker)`` of the outliers to move now, longest overrun first, one per idle worker.

    Nothing moves outside the step's tail, without a decode rate, or for a request judged against no history
    (``estimate.count == 0``: the default length).

    The router sends one /generate per request and gets nothing back until it finishes, so it estimates the tokens
    a running request has emitted as ``elapsed x tokens_per_s``, the median per-request decode rate of the step's
    requests that already finished (:func:`decode_rate`). With that estimate it applies the simulator's rule
    (pipe/simulator.py): while the step is in its tail (:func:`~sglang_histospec.pipe.planner.in_tail`), a request past
    :func:`~sglang_histospec.pipe.planner.outlier_threshold` of its prompt's history moves to an idle worker, each
    request at most once and one per idle worker. Unlike the simulator, a request alone on its worker may move too:
    a real worker can be slow or stalled, and then moving it costs one prefill.
    """
    _check_rate(tokens_per_s)
    if tokens_per_s is None or not idle_workers or not in_tail(unfinished, total, config):
        return []
    over = _overruns(
        [f for f in flights if not f.moved], tokens_per_s, lambda f: outlier_threshold(f.estimate, config)
    )
    free = [w for w in idle_workers]
    out = []
    for f in over:
        targets = [w for w in free if w != f.worker]
        if not targets:
            break
        out.append((f.key, targets[0]))
        free.remove(targets[0])
    return out


def pick_deferrals(
    flights: Sequence[InFlight],
    unfinished: int,
    total: int,
    tokens_per_s: float | None,
    config: PlannerConfig,
    step_mean: float,
    step_factor: float = DEFER_STEP_FACTOR["router"],
) -> list[int]:
    """Keys of the running requests that one-step overlap defers now, longest overrun first.

    The simulator's rule: while the step is in its tail, a request past :func:`defer_threshold` (``step_mean``:
    the step's mean predicted length; ``step_factor``: the router's ``DEFER_STEP_FACTOR``) that was deferred fewer
    than ``max_deferrals`` times. As with :func:`pick_migrations`, nothing is judged without a decode rate or
    against no history.

    Example: ``pick_deferrals([InFlight(7, 0, 3.0, 0, LengthEstimate(100.0, {0.9: 120.0}, 8, True))], 1, 16,
    60.0, PlannerConfig(), 100.0) == [7]`` (about 180 tokens > 150).
    """
    _check_rate(tokens_per_s)
    if tokens_per_s is None or not in_tail(unfinished, total, config):
        return []
    open_ = [f for f in flights if f.deferrals < config.max_deferrals]

    def limit(f: InFlight) -> float:
        return defer_threshold(f.estimate, config, step_mean, step_factor)

    return [f.key for f in _overruns(open_, tokens_per_s, limit)]


def backlog_s(flights: Sequence[InFlight], workers: int, tokens_per_s: float | None, cost: CostModel) -> list[float]:
    """Per worker, predicted seconds until ``flights`` (requests still running on it) are done: the planner's
    ``backlog`` for a step that starts while deferred requests run. Each emits
    :func:`~sglang_histospec.pipe.planner.remaining_length` more tokens, all together (:meth:`CostModel.batch_time`;
    its prefill of prompt + emitted tokens makes this a slight over-estimate).

    Example: no flights on 2 workers: ``[0.0, 0.0]``.
    """
    _check_rate(tokens_per_s)
    per: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
    for f in flights:
        emitted = f.emitted(tokens_per_s)
        per[f.worker].append((f.prompt_tokens + int(emitted), remaining_length(f.estimate, emitted)))
    return [cost.batch_time(reqs) for reqs in per]


def _check_rate(tokens_per_s: float | None) -> None:
    if tokens_per_s is not None and not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ValueError(f"tokens_per_s={tokens_per_s!r}: must be a finite rate > 0, or None when unknown")


def _overruns(flights: Sequence[InFlight], tokens_per_s: float, limit: Callable[[InFlight], float]) -> list[InFlight]:
    """The flights estimated past ``limit(flight)`` tokens, largest overrun ratio first (ties: by key); a request
    judged against no history (``estimate.count == 0``: the default length) never is."""
    over = []
    for f in flights:
        if f.estimate.count == 0:
            continue
        emitted, cap = f.emitted(tokens_per_s), limit(f)
        if emitted > cap:
            over.append((emitted / max(cap, 1.0), f))
    over.sort(key=lambda x: (-x[0], x[1].key))
    return [f for _, f in over]
