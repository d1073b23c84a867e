"""Which running requests to migrate, for a dispatcher that sees only elapsed time (pure; no HTTP).

The router sends one /generate per request and gets nothing back until it finishes, so it estimates the tokens
a running request has emitted as ``elapsed x tokens_per_s``, the median per-request decode rate of the step's
requests that already finished (:func:`decode_rate`). With that estimate it applies the simulator's rule
(pipe/simulator.py): while the step is in its tail (:func:`~sglang_histospec.pipe.planner.in_tail`), a request past
:func:`~sglang_histospec.pipe.planner.outlier_threshold` of its prompt's history moves to an idle worker, each
request at most once and one per idle worker. Unlike the simulator, a request alone on its worker may move too:
a real worker can be slow or stalled, and then moving it costs one prefill.

Example::

    f = InFlight(key=7, worker=0, elapsed_s=3.0, done_tokens=0, estimate=LengthEstimate(100.0, {0.9: 120.0}, 8, True))
    pick_migrations([f], unfinished=1, total=16, idle_workers=[1], tokens_per_s=60.0, config=PlannerConfig())
    # [(7, 1)]: about 180 tokens emitted > max(1.5 x 100, 120)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_histospec.pipe.lengths import LengthEstimate
from sglang_histospec.pipe.planner import PlannerConfig, in_tail, outlier_threshold


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
    """
    if tokens_per_s is not None and not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ValueError(f"tokens_per_s={tokens_per_s!r}: must be a finite rate > 0, or None when unknown")
    if tokens_per_s is None or not idle_workers or not in_tail(unfinished, total, config):
        return []
    over = []
    for f in flights:
        if f.moved or f.estimate.count == 0:
            continue
        emitted = f.done_tokens + f.elapsed_s * tokens_per_s
        limit = outlier_threshold(f.estimate, config)
        if emitted > limit:
            over.append((emitted / max(limit, 1.0), f))
    over.sort(key=lambda x: (-x[0], x[1].key))
    free = [w for w in idle_workers]
    out = []
    for _, f in over:
        targets = [w for w in free if w != f.worker]
        if not targets:
            break
        out.append((f.key, targets[0]))
        free.remove(targets[0])
    return out
