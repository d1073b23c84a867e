"""Step makespan and idle time of rollout workers from the (start, end) intervals of their requests (pure).

A worker is busy while at least one of its requests is in flight. Example::

    measure_step({0: [(0.0, 4.0), (1.0, 2.0)], 1: [(0.0, 1.0), (3.0, 4.0)]}, workers=2)
    # StepTimes(start=0.0, end=4.0, makespan=4.0, busy_s=6.0, idle_s=2.0): worker 1 idles from 1 to 3
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepTimes:
    start: float
    end: float
    makespan: float
    busy_s: float
    """Worker-seconds with at least one request in flight, summed over workers."""
    idle_s: float
    """``workers x makespan - busy_s``: worker-time inside the step with nothing in flight."""


def busy_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals. Example: ``[(0, 2), (1, 3), (5, 6)] -> 4.0``."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if not (math.isfinite(a) and math.isfinite(b) and b >= a):
            raise ValueError(f"interval ({a!r}, {b!r}): need finite start <= end")
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def measure_step(by_worker: Mapping[int, Iterable[tuple[float, float]]], workers: int) -> StepTimes:
    """Makespan (first start to last end over every worker) and busy / idle worker-time of one step."""
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers={workers!r}: must be an int >= 1")
    if any(not 0 <= w < workers for w in by_worker):
        raise ValueError(f"workers {sorted(by_worker)} outside [0, {workers}): give worker indices")
    spans = {w: list(v) for w, v in by_worker.items()}
    points = [t for v in spans.values() for iv in v for t in iv]
    if not points:
        raise ValueError("the step has no request interval")
    start, end = min(points), max(points)
    busy = sum(busy_length(v) for v in spans.values())
    return StepTimes(start, end, end - start, busy, max(0.0, workers * (end - start) - busy))
