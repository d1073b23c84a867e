"""Relative cost of one verify forward pass over k tokens per request at batch size b (for est_speedup, budgets).

``cost(k, b)``: the time of a pass in which each of b requests carries k query tokens (root + k - 1 draft
nodes) over a plain decode pass at the same batch size, so ``cost(1, b) = 1``. The file format of
``histospec replay --verify-cost FILE``, the interpolation rules and the built-in default (``DEFAULT_TABLE``, a
roofline *model*, not a measurement) are in docs/replay.md section 5.

Example::

    >>> t = VerifyCostTable.default()
    >>> t.cost(1, 1), round(t.cost(9, 1), 2), round(t.cost(9, 64), 2)
    (1.0, 1.08, 2.25)
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass

KNEE_TOKENS = 256
"""Tokens per pass at which the default roofline turns compute-bound."""
PER_TOKEN = 0.01
"""Extra relative cost per extra query token while memory-bound (default model)."""


def _roofline(k: int, b: int) -> float:
    return max(1.0 + PER_TOKEN * (k - 1), b * k / KNEE_TOKENS) / max(1.0, b / KNEE_TOKENS)


@dataclass(slots=True)
class VerifyCostTable:
    """``batches[b] = (ks, costs)``: sorted k values and the relative cost of each."""

    batches: dict[int, tuple[list[int], list[float]]]

    @classmethod
    def default(cls) -> VerifyCostTable:
        ks = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
        return cls({b: (ks, [_roofline(k, b) for k in ks]) for b in (1, 8, 16, 32, 64, 128, 256)})

    @classmethod
    def from_dict(cls, obj: dict, where: str = "verify-cost table") -> VerifyCostTable:
        raw = obj.get("batches") if isinstance(obj, dict) else None
        if not isinstance(raw, dict) or not raw:
            raise ValueError(f"{where}: expected {{'batches': {{'<b>': {{'<k>': cost}}}}}}, got {obj!r:.200}")
        batches: dict[int, tuple[list[int], list[float]]] = {}
        for b_key, row in raw.items():
            try:
                b = int(b_key)
                pts = sorted((int(k), float(c)) for k, c in row.items())
            except (TypeError, ValueError, AttributeError):
                raise ValueError(f"{where}: batch {b_key!r}: keys must be ints and costs numbers") from None
            if b < 1 or not pts or pts[0][0] < 1:
                raise ValueError(f"{where}: batch {b_key!r}: batch and k must be >= 1 and the row non-empty")
            costs = [c for _, c in pts]
            if any(c <= 0 for c in costs) or any(b2 < a2 for a2, b2 in zip(costs, costs[1:])):
                raise ValueError(f"{where}: batch {b}: costs must be > 0 and non-decreasing in k, got {costs}")
            batches[b] = ([k for k, _ in pts], costs)
        return cls(batches)

    @classmethod
    def load(cls, path: str | os.PathLike) -> VerifyCostTable:
        with open(path, encoding="utf-8") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        return cls.from_dict(obj, str(path))

    def to_dict(self) -> dict:
        return {"batches": {str(b): {str(k): c for k, c in zip(*row)} for b, row in sorted(self.batches.items())}}

    def row(self, b: int) -> tuple[list[int], list[float]]:
        keys = sorted(self.batches)
        i = bisect.bisect_right(keys, b) - 1
        return self.batches[keys[max(i, 0)]]

    def cost(self, k: int, b: int = 1) -> float:
        """Relative cost of verifying k tokens per request at batch b; normalised so that cost(1, b) = 1."""
        if k < 1 or b < 1:
            raise ValueError(f"cost(k={k}, b={b}): k and b must be >= 1")
        ks, cs = self.row(b)
        return _interp(ks, cs, k) / _interp(ks, cs, 1)


def _interp(ks: list[int], cs: list[float], k: int) -> float:
    if len(ks) == 1:
        return cs[0]
    i = bisect.bisect_left(ks, k)
    if i < len(ks) and ks[i] == k:
        return cs[i]
    if i == 0:
        i = 1
    elif i == len(ks):
        i = len(ks) - 1
    k0, k1, c0, c1 = ks[i - 1], ks[i], cs[i - 1], cs[i]
    return max(c0 + (c1 - c0) * (k - k0) / (k1 - k0), 1e-9)
