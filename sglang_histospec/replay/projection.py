"""Projected rollout time of a lockstep replay on a verify-cost table: plain decoding, a drafter, and the adaptive cut.

A rollout step decodes in rounds; round r runs ``b_r`` requests (fewer as responses finish: the tail) and verifies
``R_r`` rows (a root per request plus its verified draft nodes). Its projected time is the table's pass time at that
batch and mean rows plus the round's measured host time (drafting and extending) over ``host_speed``; plain decoding
runs one row per request and no host work, in rounds of its own (a response of L tokens takes L of them). A
**projection, not a measurement**: the pass times are the table's (a model unless it was measured), the host time
this machine's. docs/replay.md section 5.

Example (the table costs 1 ms a pass whatever its size; two requests of 3 and 1 tokens)::

    >>> t = VerifyCostTable.from_ms({1: ([1, 64], [1.0, 1.0])}, "flat")
    >>> p = project_rounds([(0, 2, 4, 0), (0, 1, 1, 0)], [3, 1], None, ProjectionConfig(t))
    >>> p.plain_ms, p.ms, p.speedup
    (3.0, 2.0, 1.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sglang_histospec.drafting.calibration import DraftCalibration
from sglang_histospec.drafting.draft_cut import StepCostConfig
from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.drafting.verify_cost import VerifyCostTable
from sglang_histospec.engine.governor import GovernorConfig
from sglang_histospec.engine.policy import SCALE_RANGE

TAIL_FRACTION = 0.25
"""A round is in the step's tail when fewer than this share of the step's requests still run."""
POLICIES = ("fixed", "adaptive")
"""``histospec replay --policy``: every draft verified whole, or the adaptive cut (``TableCut``)."""
_GOVERNOR, _STEP_COST = GovernorConfig(), StepCostConfig()


@dataclass(slots=True)
class ProjectionConfig:
    """The table and the host: ``host_speed`` x this machine's single-thread drafting speed (3 = three times faster)."""

    table: VerifyCostTable
    host_speed: float = 1.0
    tail_fraction: float = TAIL_FRACTION

    def __post_init__(self) -> None:
        if self.table.ms is None:
            raise ValueError(f"{self.table.label}: a projection needs absolute pass times ('ms' in the table)")
        if not (self.host_speed > 0 and math.isfinite(self.host_speed)):
            raise ValueError(f"--host-speed {self.host_speed!r}: expected a number > 0 (1 = this machine)")


@dataclass(slots=True)
class Projection:
    """Projected milliseconds of a rollout (a step or a whole trace): plain and the drafter's, split in pass and host
    time, with the share of each spent in the tail."""

    plain_ms: float = 0.0
    pass_ms: float = 0.0
    host_ms: float = 0.0
    tail_ms: float = 0.0
    plain_tail_ms: float = 0.0
    rounds: int = 0
    plain_rounds: int = 0

    @property
    def ms(self) -> float:
        return self.pass_ms + self.host_ms

    @property
    def speedup(self) -> float:
        return self.plain_ms / self.ms if self.ms > 0 else 1.0

    def add(self, other: Projection) -> None:
        for name in ("plain_ms", "pass_ms", "host_ms", "tail_ms", "plain_tail_ms", "rounds", "plain_rounds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_json(self) -> dict:
        r = lambda x: round(x, 3)  # noqa: E731
        return {
            "plain_ms": r(self.plain_ms), "ms": r(self.ms), "pass_ms": r(self.pass_ms), "host_ms": r(self.host_ms),
            "speedup": round(self.speedup, 4), "rounds": self.rounds, "plain_rounds": self.plain_rounds,
            "tail_share": round(self.tail_ms / self.ms, 4) if self.ms > 0 else 0.0,
            "plain_tail_share": round(self.plain_tail_ms / self.plain_ms, 4) if self.plain_ms > 0 else 0.0,
        }  # fmt: skip


def plain_batches(lengths: list[int], width: int | None) -> np.ndarray:
    """Running requests per round of plain decoding (one token a round), admitting in the given order up to
    ``width`` at once (None = all at round 0). Example: ``plain_batches([3, 1, 2], 2)`` is ``[2, 2, 2]`` (the third starts when the second ends)."""
    lens = [n for n in lengths if n > 0]
    if not lens:
        return np.zeros(0, dtype=np.int64)
    if width is None or width >= len(lens):
        arr = np.asarray(lens)
        return (arr[None, :] > np.arange(arr.max())[:, None]).sum(1)
    free = [0] * width  # the round each slot frees up
    starts = []
    for n in lens:
        slot = min(range(width), key=free.__getitem__)
        starts.append(free[slot])
        free[slot] += n
    delta = np.zeros(max(free) + 1, dtype=np.int64)
    for s, n in zip(starts, lens):
        delta[s] += 1
        delta[s + n] -= 1
    return np.cumsum(delta)[:-1]


def project_rounds(
    rounds: list[tuple[int, int, int, int]], lengths: list[int], width: int | None, cfg: ProjectionConfig
) -> Projection:
    """The projection of one step: its replayed ``rounds`` (step, batch, rows, host ns) against plain decoding of
    its responses' ``lengths`` (in admission order)."""
    out = Projection()
    n = sum(1 for x in lengths if x > 0)
    tail = cfg.tail_fraction * n
    for b in plain_batches(lengths, width):
        t = cfg.table.pass_ms(1, int(b))
        out.plain_ms += t
        out.plain_tail_ms += t if b < tail else 0.0
        out.plain_rounds += 1
    for _, b, rows, host_ns in rounds:
        if b < 1:
            continue
        t, h = cfg.table.pass_ms(rows / b, b), host_ns / 1e6 / cfg.host_speed
        out.pass_ms += t
        out.host_ms += h
        out.tail_ms += t + h if b < tail else 0.0
        out.rounds += 1
    return out


def project(
    rounds: list[tuple[int, int, int, int]], lengths: dict[int, list[int]], width: int | None, cfg: ProjectionConfig
) -> tuple[Projection, dict[int, Projection]]:
    """The whole trace's projection and each step's; ``lengths[step]`` = its response lengths in admission order."""
    by_step: dict[int, list] = {s: [] for s in lengths}
    for r in rounds:
        by_step.setdefault(r[0], []).append(r)
    per_step = {s: project_rounds(by_step[s], lengths.get(s, []), width, cfg) for s in sorted(by_step)}
    total = Projection()
    for p in per_step.values():
        total.add(p)
    return total, per_step


def trim(draft: Draft, keep: np.ndarray) -> Draft:
    """The nodes of ``draft`` marked in ``keep`` whose ancestors are all kept, parents renumbered. Example: nodes
    [5, 7, 6] under parents [-1, -1, 0], keep [True, False, True]: ``Draft([5, 6], [-1, 0], ...)``."""
    if keep.all():
        return draft
    new = np.full(len(draft), -2, dtype=np.int64)
    toks, parents, probs = [], [], []
    for i, (t, p, q) in enumerate(zip(draft.token_ids, draft.parents, draft.probs)):
        if keep[i] and (p == ROOT or new[p] >= 0):
            new[i] = len(toks)
            toks.append(t)
            parents.append(ROOT if p == ROOT else int(new[p]))
            probs.append(q)
    if not toks:
        return Draft.empty()
    return Draft(toks, parents, probs, match_len=draft.match_len, source=draft.source)


@dataclass(slots=True)
class TableCut:
    """The engine's cost cut (engine/policy.py) with the table as its step model: each round keeps the k most likely
    nodes of the batch (calibrated path probability x the acceptance scale) that maximise tokens per millisecond,
    ``(b + p_1 + ... + p_k) / pass_ms(1 + k / b, b)``, at least one; when even that rate with the round's host time is
    below a plain round's, the next 1, 2, 4, ... up to ``pause_steps`` rounds do not draft. A round of a batch at
    which no draft could pay (every node accepted, host time free) does not draft. The measured guard (the governor)
    has nothing to measure here: the table is the truth. Example: ``TableCut(table, drafter.calibration, budget=8)``.
    """

    table: VerifyCostTable
    calibration: DraftCalibration
    budget: int
    host_speed: float = 1.0
    pause_steps: int = _STEP_COST.pause_steps
    scale_decay: float = _GOVERNOR.scale_decay
    scale_prior: float = _GOVERNOR.scale_prior
    counts: dict = field(default_factory=lambda: {"rounds": 0, "drafted": 0, "paused": 0, "never_pays": 0})
    _costs: dict = field(default_factory=dict)
    _pause: int = 0
    _pause_len: int = 1
    _scale: list = field(default_factory=lambda: [0.0, 0.0])
    _predicted: float = 0.0

    def costs(self, b: int) -> np.ndarray:
        """pass_ms at batch ``b`` with 0 .. b x budget draft rows in all."""
        if b not in self._costs:
            self._costs[b] = np.array([self.table.pass_ms(1 + e / b, b) for e in range(b * self.budget + 1)])
        return self._costs[b]

    def pays(self, b: int) -> bool:
        """Whether any number of draft rows, all accepted, beats a plain pass at batch ``b``."""
        c = self.costs(b)
        rates = (b + np.arange(len(c))) / c
        return bool(rates[1:].max(initial=0.0) > rates[0] * (1 + 1e-9))

    def drafts(self, batch: int) -> bool:
        self.counts["rounds"] += 1
        if self._pause > 0:
            self._pause -= 1
            self.counts["paused"] += 1
            return False
        if not self.pays(batch):
            self.counts["never_pays"] += 1
            return False
        self.counts["drafted"] += 1
        return True

    def scale(self) -> float:
        s = (self._scale[0] + self.scale_prior) / (self._scale[1] + self.scale_prior)
        return min(max(s, SCALE_RANGE[0]), SCALE_RANGE[1])

    def cut(self, batch: int, drafts: list[Draft], host_ns: int) -> list[Draft]:
        n = sum(len(d) for d in drafts)
        if n == 0:
            return drafts
        p = np.minimum(self.calibration.calibrate_drafts(drafts) * self.scale(), 1.0)
        order = np.argsort(-p, kind="stable")
        cum = np.concatenate(([0.0], np.cumsum(p[order])))
        c = self.costs(batch)[: n + 1]
        k = max(int(np.argmax((batch + cum) / c)), 1)
        host_ms = host_ns / 1e6 / self.host_speed
        if (batch + cum[k]) / (c[k] + host_ms) < batch / c[0]:
            self._pause = min(self._pause_len, self.pause_steps)
            self._pause_len = min(2 * self._pause_len, max(1, self.pause_steps))
        else:
            self._pause_len = 1
        keep = np.zeros(n, dtype=bool)
        keep[order[:k]] = True
        self._predicted = float(p[order[:k]].sum())
        out, at = [], 0
        for d in drafts:
            out.append(trim(d, keep[at : at + len(d)]))
            at += len(d)
        return out

    def learn(self, verified: list[Draft], accepted: list[int]) -> None:
        a = self.scale_decay
        self._scale = [a * self._scale[0] + sum(accepted), a * self._scale[1] + self._predicted]

    def new_step(self) -> None:
        self._pause, self._pause_len, self._scale = 0, 1, [0.0, 0.0]
