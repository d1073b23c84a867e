"""Relative cost of one verify forward pass over k tokens per request at batch size b (for est_speedup, budgets).

``cost(k, b)``: the time of a pass in which each of b requests carries k query tokens (root + k - 1 draft
nodes) over a plain decode pass at the same batch size, so ``cost(1, b) = 1``; ``pass_ms(k, b)``: the pass's
absolute time, where the table has one (``histospec bench verify-cost`` measures it; the default models it). The
file format of ``histospec replay --verify-cost FILE``, the interpolation rules and the built-in default (a
roofline *model*, not a measurement) are in docs/replay.md section 5.

Example::

    >>> t = VerifyCostTable.default()
    >>> t.cost(1, 1), round(t.cost(9, 1), 2), round(t.cost(9, 64), 2)
    (1.0, 1.08, 2.25)
    >>> round(t.pass_ms(1, 1), 2), round(t.pass_ms(9, 256), 1), t.measured
    (4.8, 43.2, False)
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, field

KNEE_TOKENS = 256
"""Tokens per pass at which the default roofline turns compute-bound."""
PER_TOKEN = 0.01
"""Extra relative cost per extra query token while memory-bound (default model)."""
WEIGHTS_MS = 4.8
"""The default model's memory-bound pass: 16 GB of bf16 weights (an 8B model) read at 3.35 TB/s (one H100); the
KV cache's reads are left out."""
DEFAULT_BATCHES = (1, 8, 16, 32, 64, 128, 256)
DEFAULT_KS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_LABEL = (
    "roofline MODEL, not a measurement: max(1 + 0.01 (k - 1), b k / 256) x 4.8 ms (8B bf16 weights at 3.35 TB/s, "
    "KV reads left out)"
)


def _roofline_ms(k: int, b: int) -> float:
    return WEIGHTS_MS * max(1.0 + PER_TOKEN * (k - 1), b * k / KNEE_TOKENS)


Rows = dict[int, tuple[list[int], list[float]]]
"""``{b: (ks, values)}``: per batch size, sorted k values and a value for each."""


@dataclass(slots=True)
class VerifyCostTable:
    """``batches[b] = (ks, costs)``: sorted k values and the relative cost of each; ``ms``: the same grid's absolute
    pass times in milliseconds (None: relative costs only); ``label`` says what the table is (measured or model);
    ``meta``: how it was measured (device, model, dtype, context, commit, date)."""

    batches: Rows
    ms: Rows | None = None
    label: str = "verify-cost table"
    meta: dict = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        """True for a table of measured pass times (``meta["measured"]``), False for a model or relative costs."""
        return bool(self.meta.get("measured"))

    @classmethod
    def default(cls) -> VerifyCostTable:
        ms = {b: (list(DEFAULT_KS), [_roofline_ms(k, b) for k in DEFAULT_KS]) for b in DEFAULT_BATCHES}
        return cls.from_ms(ms, DEFAULT_LABEL, {"measured": False, "model": "roofline"})

    @classmethod
    def from_ms(cls, ms: Rows, label: str, meta: dict | None = None) -> VerifyCostTable:
        """The table of absolute pass times ``ms`` (relative costs derived: each over its batch's k = 1, read as
        ``cost`` reads them). Example: ``from_ms({1: ([1, 2], [2.0, 3.0])}, "x").cost(2, 1)`` is 1.5."""
        rel = {b: (ks, [v / _interp(ks, vs, 1) for v in vs]) for b, (ks, vs) in ms.items()}
        return cls(rel, {b: (list(ks), list(vs)) for b, (ks, vs) in ms.items()}, label, dict(meta or {}))

    @classmethod
    def from_dict(cls, obj: dict, where: str = "verify-cost table") -> VerifyCostTable:
        """The file format (docs/replay.md section 5): ``batches`` (relative costs) and/or ``ms`` (absolute pass
        times; ``batches`` is derived from them when absent), optional ``label`` and ``meta``."""
        if not isinstance(obj, dict) or not (obj.get("batches") or obj.get("ms")):
            raise ValueError(f"{where}: expected {{'batches': {{'<b>': {{'<k>': cost}}}}}} or 'ms', got {obj!r:.200}")
        label, meta = str(obj.get("label", where)), obj.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: 'meta' must be an object, got {meta!r:.100}")
        ms = _parse_rows(obj["ms"], f"{where} (ms)") if obj.get("ms") else None
        if not obj.get("batches"):
            return cls.from_ms(ms, label, meta)
        return cls(_parse_rows(obj["batches"], where), ms, label, dict(meta))

    @classmethod
    def load(cls, path: str | os.PathLike) -> VerifyCostTable:
        with open(path, encoding="utf-8") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        return cls.from_dict(obj, str(path))

    def to_dict(self) -> dict:
        out: dict = {"label": self.label, "meta": self.meta, "batches": _rows_dict(self.batches)}
        if self.ms is not None:
            out["ms"] = _rows_dict(self.ms)
        return out

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

    def pass_ms(self, k: float, b: float) -> float:
        """Milliseconds of a pass of ``b`` requests carrying ``k`` query rows each on average (fractional: a ragged
        tree batch of b k rows): linear in k within a batch's row (extrapolated from its last two points), linear
        in b between the listed batch sizes (extrapolated from the two nearest). Needs a table with ``ms``."""
        if self.ms is None:
            raise ValueError(
                f"{self.label}: no absolute pass times ('ms'); measure one with histospec bench verify-cost"
            )
        if k < 1 or b < 1:
            raise ValueError(f"pass_ms(k={k}, b={b}): k and b must be >= 1")
        keys = sorted(self.ms)
        if len(keys) == 1:
            return _interp(*self.ms[keys[0]], k)
        i = min(max(bisect.bisect_left(keys, b), 1), len(keys) - 1)
        b0, b1 = keys[i - 1], keys[i]
        t0, t1 = _interp(*self.ms[b0], k), _interp(*self.ms[b1], k)
        return max(t0 + (t1 - t0) * (b - b0) / (b1 - b0), 1e-9)


def _rows_dict(rows: Rows) -> dict:
    return {str(b): {str(k): c for k, c in zip(*row)} for b, row in sorted(rows.items())}


def _parse_rows(raw: object, where: str) -> Rows:
    """``{"<b>": {"<k>": value}}`` -> ``Rows``, checked: ints >= 1, values > 0 and non-decreasing in k."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where}: expected {{'<b>': {{'<k>': value}}}}, got {raw!r:.200}")
    batches: Rows = {}
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
    return batches


def _interp(ks: list[int], cs: list[float], k: float) -> float:
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
