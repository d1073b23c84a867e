"""Exact offline replay of a drafter on a recorded trace, and the oracle that bounds it (docs/replay.md).

:func:`replay` decodes every response step by step against its recorded tokens (rules: its docstring; semantics:
docs/replay.md section 3; the metrics ``tau``, ``accept_rate``, ``oracle_tau``, ``est_speedup``: sections 4-6).

Example (``NoneDrafter`` never drafts, so every verify step emits exactly one token)::

    >>> from sglang_histospec.trace.format import TraceRecord, TraceStep
    >>> steps = [TraceStep(0, [TraceRecord(0, "p", 0, [1], [2, 3, 4])])]
    >>> r = replay(steps, NoneDrafter(), ReplayConfig(budget=4))
    >>> r.tau, r.verify_steps, r.oracle_tau
    (1.0, 3, 1.0)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from sglang_histospec.drafting.types import MAX_BUDGET, SOURCES, AcceptanceRates, Draft, accepted_length
from sglang_histospec.drafting.verify_cost import VerifyCostTable
from sglang_histospec.trace.format import TraceRecord, TraceStep
from sglang_histospec.trace.kgrams import KeySet, kgram_keys, leading_true, self_occurs


class ReplayDrafter(Protocol):
    """What replay drives; adapters for HistoSpec, RhymeRL, prompt lookup and the peers implement it."""

    name: str
    sources: tuple[str, ...]
    """Sources the drafter may draft from (subset of ``SOURCES``); the oracle uses exactly these."""
    window: int | None
    """History visits of a prompt the drafter keeps (None = all)."""
    live_global: bool
    """True when finished responses of the open step are visible to the global source at once."""

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None: ...
    def extend(self, req_id: str, tokens: list[int]) -> None: ...
    def draft(self, req_id: str, budget: int) -> Draft: ...
    def finish(self, req_id: str, response: list[int]) -> None: ...
    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        """Close ``step``; ``groups`` = (prompt_id, prompt, responses by sample, rewards or None) per prompt."""
        ...

    def budget(self, req_id: str, cap: int) -> int:
        """Budget of the request's next verify step, at most ``cap`` (per-request AIMD lives here)."""
        ...

    def observe(self, req_id: str, drafted: int, accepted: int) -> None: ...


class BaseDrafter:
    """Defaults for ``ReplayDrafter``: fixed budget, no-op lifecycle; subclasses override what they need."""

    name = "base"
    sources: tuple[str, ...] = ()
    window: int | None = None
    live_global = False
    pads_to_budget = False
    """True when the engine verifies ``budget`` nodes whatever the draft's size (est_speedup charges them)."""

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None:
        pass

    def extend(self, req_id: str, tokens: list[int]) -> None:
        pass

    def draft(self, req_id: str, budget: int) -> Draft:
        return Draft.empty()

    def finish(self, req_id: str, response: list[int]) -> None:
        pass

    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        pass

    def budget(self, req_id: str, cap: int) -> int:
        return cap

    def observe(self, req_id: str, drafted: int, accepted: int) -> None:
        pass


class NoneDrafter(BaseDrafter):
    """No speculation: tau = 1."""

    name = "none"


def accept_length(draft: Draft, target: Sequence[int], start: int) -> int:
    """Nodes of ``draft`` accepted when the realized tokens from ``start`` on are ``target[start:]``
    (:func:`~sglang_histospec.drafting.types.accepted_length`)."""
    return accepted_length(draft.token_ids, draft.parents, target, start)


@dataclass(slots=True)
class ReplayConfig:
    """How to replay."""

    budget: int
    """N: at most this many draft nodes per verify step (drafters with AIMD use less)."""
    oracle: bool = True
    """Compute ``oracle_tau`` (costs about as much as a fast drafter)."""
    verify_cost: VerifyCostTable | None = None
    """When set, report ``est_speedup`` with this table."""
    batch: int = 1
    """Batch size at which the verify cost is read."""
    progress: bool = False
    """Show a progress bar on stderr (tqdm; only when stderr is a terminal)."""
    oracle_sources: tuple[str, ...] | None = None
    """Oracle sources; None = the drafter's (only then is the oracle a proven upper bound of the drafter)."""
    oracle_all_history: bool = False
    """Oracle over every earlier visit of the prompt instead of the drafter's window."""

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or not 0 <= self.budget <= MAX_BUDGET:
            raise ValueError(f"budget={self.budget!r} must be an int in [0, {MAX_BUDGET}]")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch} must be >= 1")
        if self.oracle_sources is not None and not set(self.oracle_sources) <= set(SOURCES):
            raise ValueError(f"oracle_sources={self.oracle_sources!r}: expected names from {SOURCES}")


@dataclass(slots=True)
class StepStats:
    """Per training step totals (for plots)."""

    step: int
    responses: int = 0
    tokens: int = 0
    verify_steps: int = 0
    oracle_steps: int = 0


@dataclass(slots=True)
class ReplayResult(AcceptanceRates):
    """Output of ``replay``; ``to_json()`` gives the documented JSON object."""

    drafter: str
    budget: int
    responses: int = 0
    tokens: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    oracle_steps: int = 0
    draft_us_p50: float = 0.0
    draft_us_p99: float = 0.0
    est_speedup: float | None = None
    wall_s: float = 0.0
    per_step: list[StepStats] = field(default_factory=list)
    accept_hist: list[int] = field(default_factory=list)
    """accept_hist[a] = verify steps that accepted a nodes."""
    calibration: dict | None = None
    """How well the drafter's probabilities predicted acceptance (drafters with ``calibration_report``)."""

    @property
    def oracle_tau(self) -> float | None:
        return self.tokens / self.oracle_steps if self.oracle_steps else None

    def to_json(self) -> dict:
        out = {
            "drafter": self.drafter,
            "budget": self.budget,
            "responses": self.responses,
            "tokens": self.tokens,
            "verify_steps": self.verify_steps,
            "tau": round(self.tau, 6),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accept_rate": round(self.accept_rate, 6),
            "oracle_tau": None if self.oracle_tau is None else round(self.oracle_tau, 6),
            "draft_us_p50": round(self.draft_us_p50, 3),
            "draft_us_p99": round(self.draft_us_p99, 3),
        }
        if self.est_speedup is not None:
            out["est_speedup"] = round(self.est_speedup, 6)
        out["wall_s"] = round(self.wall_s, 3)
        out["tokens_per_min"] = round(self.tokens / self.wall_s * 60) if self.wall_s > 0 else None
        if self.calibration is not None:
            out["calibration"] = self.calibration
        out["per_step"] = [asdict(s) for s in self.per_step]
        return out


class Oracle:
    """Longest-prefix oracle over the sources a drafter may use (docs/replay.md, "Oracle").

    Sequences are ``prompt + response`` (a superset of what any drafter indexes, so the bound stays valid).
    """

    def __init__(self, budget: int, sources: tuple[str, ...], window: int | None, live_global: bool) -> None:
        bad = set(sources) - set(SOURCES)
        if bad:
            raise ValueError(f"unknown sources {sorted(bad)}; known: {SOURCES}")
        self.kmax = max(budget, 1)
        self.budget = budget
        self.sources = set(sources)
        self.window = window
        self.live_global = live_global
        self.history: dict[str, deque[KeySet]] = {}
        self.open: dict[str, KeySet] = {}
        self.glob = KeySet(self.kmax)

    def steps(self, rec: TraceRecord, keys: np.ndarray) -> int:
        """Verify steps the oracle needs for ``rec``; ``keys = kgram_keys(rec.prompt + rec.response, kmax)``."""
        n = len(rec.response)
        if n == 0:
            return 0
        if self.budget == 0 or not self.sources:
            return n
        plen = len(rec.prompt)
        rkeys = keys[:, plen:]
        mask = np.zeros(rkeys.shape, dtype=bool)
        if "history" in self.sources:
            for ks in self.history.get(rec.prompt_id, ()):
                mask |= ks.contains(rkeys)
        if "siblings" in self.sources and rec.prompt_id in self.open:
            mask |= self.open[rec.prompt_id].contains(rkeys)
        if "global" in self.sources:
            mask |= self.glob.contains(rkeys)
        if "self" in self.sources:
            mask |= self_occurs(rec.prompt, rec.response, self.kmax, keys)
        reach = leading_true(mask).tolist()
        p = steps = 0
        while p < n:
            p += min(reach[p], self.budget) + 1
            steps += 1
        return steps

    def finished(self, rec: TraceRecord, keys: np.ndarray) -> None:
        self.open.setdefault(rec.prompt_id, KeySet(self.kmax)).add_keys(keys)
        if "global" in self.sources and self.live_global:
            self.glob.add_keys(keys)

    def end_step(self) -> None:
        for pid, ks in self.open.items():
            hist = self.history.setdefault(pid, deque(maxlen=self.window))
            hist.append(ks)
            if "global" in self.sources and not self.live_global:
                self.glob.add_keys_from(ks)
        self.open = {}


def sibling_order(records: list[TraceRecord]) -> list[TraceRecord]:
    """Decode order within a step: shorter responses first, ties by sample index, then prompt appearance."""
    first: dict[str, int] = {}
    for r in records:
        first.setdefault(r.prompt_id, len(first))
    return sorted(records, key=lambda r: (len(r.response), r.sample, first[r.prompt_id]))


def _groups(records: list[TraceRecord]) -> list[tuple[str, list[int], list[list[int]], list[float] | None]]:
    by: dict[str, list[TraceRecord]] = {}
    for r in records:
        by.setdefault(r.prompt_id, []).append(r)
    out = []
    for pid, rs in by.items():
        rs = sorted(rs, key=lambda r: r.sample)
        rewards = [r.reward for r in rs]
        out.append((pid, rs[0].prompt, [r.response for r in rs], None if any(x is None for x in rewards) else rewards))
    return out


@dataclass(slots=True)
class _Tally:
    """What ``replay`` sums over every verify step of the trace."""

    accept_hist: list[int]
    """accept_hist[a] = verify steps that accepted a nodes."""
    costs: list[float] | None
    """costs[d] = verify cost of d draft nodes (plus the bonus row) at the configured batch; None = not measured."""
    draft_ns: list[int] = field(default_factory=list)
    """Wall time of every ``draft`` call."""
    cost_sum: float = 0.0


def _oracle(drafter: ReplayDrafter, cfg: ReplayConfig) -> Oracle | None:
    """The oracle of ``cfg`` over the drafter's sources and window (None when ``cfg.oracle`` is off)."""
    if not cfg.oracle:
        return None
    sources = drafter.sources if cfg.oracle_sources is None else tuple(cfg.oracle_sources)
    window = None if cfg.oracle_all_history else drafter.window
    return Oracle(cfg.budget, sources, window, drafter.live_global)


def _decode_response(
    drafter: ReplayDrafter, rid: str, rec: TraceRecord, cap: int, res: ReplayResult, tally: _Tally
) -> int:
    """Decode ``rec``'s response as request ``rid``, verify step by verify step (at most ``cap`` draft nodes
    each); adds drafted and accepted nodes to ``res`` and the step figures to ``tally``; returns the verify steps."""
    resp = rec.response
    n = len(resp)
    clock = time.perf_counter_ns
    costs, pads = tally.costs, bool(getattr(drafter, "pads_to_budget", False))
    drafter.start(rid, rec.prompt_id, rec.prompt)
    p = vsteps = 0
    while p < n:
        b = drafter.budget(rid, cap)
        t0 = clock()
        d = drafter.draft(rid, b)
        tally.draft_ns.append(clock() - t0)
        nd = len(d.token_ids)
        if nd > b:
            raise RuntimeError(f"drafter {drafter.name!r} returned {nd} nodes for budget {b}")
        a = accept_length(d, resp, p) if nd else 0
        e = min(a + 1, n - p)
        drafter.extend(rid, resp[p : p + e])
        drafter.observe(rid, nd, a)
        p += e
        vsteps += 1
        res.drafted += nd
        res.accepted += a
        tally.accept_hist[a] += 1
        if costs is not None:
            tally.cost_sum += costs[min(b, cap) if pads else nd]
    drafter.finish(rid, resp)
    return vsteps


def _add_step(res: ReplayResult, ss: StepStats) -> None:
    res.per_step.append(ss)
    res.responses += ss.responses
    res.tokens += ss.tokens
    res.verify_steps += ss.verify_steps
    res.oracle_steps += ss.oracle_steps


def _finish(res: ReplayResult, tally: _Tally, drafter: ReplayDrafter) -> None:
    """The figures of ``res`` that are computed once at the end: latency percentiles, est_speedup, calibration."""
    if tally.draft_ns:
        us = np.asarray(tally.draft_ns, dtype=np.float64) / 1e3
        res.draft_us_p50 = float(np.percentile(us, 50))
        res.draft_us_p99 = float(np.percentile(us, 99))
    if tally.costs is not None and tally.cost_sum > 0:
        res.est_speedup = res.tokens / tally.cost_sum
    res.accept_hist = tally.accept_hist
    report = getattr(drafter, "calibration_report", None)
    res.calibration = report() if report is not None else None


def replay(steps: Sequence[TraceStep], drafter: ReplayDrafter, cfg: ReplayConfig) -> ReplayResult:
    """Replay ``steps`` (sorted by step, e.g. from ``load_steps``) with ``drafter``; docs/replay.md section 3.

    Steps in increasing order; within a step responses are decoded one after the other in the *sibling order*
    (``sibling_order``); after a step the drafter's ``end_step`` turns its responses into history. Each verify step
    drafts at most ``budget`` nodes, accepts the longest root path equal to the realized tokens
    (``accept_length``) and emits it plus the bonus token. Semantics: docs/replay.md section 3; the metrics
    (``tau``, ``accept_rate``, ``oracle_tau``, ``draft_us_p50/p99``, ``est_speedup``): sections 4-6.
    """
    if any(b.step <= a.step for a, b in zip(steps, steps[1:])):
        raise ValueError("steps must be strictly increasing (use trace.load_steps, which sorts)")
    res = ReplayResult(drafter.name, cfg.budget)
    oracle = _oracle(drafter, cfg)
    kmax = max(cfg.budget, 1)
    costs = [cfg.verify_cost.cost(1 + d, cfg.batch) for d in range(cfg.budget + 1)] if cfg.verify_cost else None
    tally = _Tally([0] * (cfg.budget + 1), costs)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        total = sum(len(s.records) for s in steps)
        bar = tqdm(total=total, unit="resp", desc=f"replay {drafter.name}", leave=False, disable=None)
    t_start = time.perf_counter()
    for st in steps:
        ss = StepStats(st.step)
        for rec in sibling_order(st.records):
            rid = f"{st.step}:{rec.prompt_id}:{rec.sample}"
            ss.verify_steps += _decode_response(drafter, rid, rec, cfg.budget, res, tally)
            ss.responses += 1
            ss.tokens += len(rec.response)
            if oracle is not None:
                keys = kgram_keys(rec.prompt + rec.response, kmax)
                ss.oracle_steps += oracle.steps(rec, keys)
                oracle.finished(rec, keys)
            if bar is not None:
                bar.update(1)
        drafter.end_step(st.step, _groups(st.records))
        if oracle is not None:
            oracle.end_step()
        _add_step(res, ss)
    if bar is not None:
        bar.close()
    res.wall_s = time.perf_counter() - t_start
    _finish(res, tally, drafter)
    return res
