"""Exact offline replay of a drafter on a recorded trace, and the oracle that bounds it (docs/replay.md).

:func:`replay` decodes every response verify step by verify step against its recorded tokens, a step's requests
concurrently (``schedule="lockstep"``) or one after another (``"sequential"``); rules: its docstring; semantics:
docs/replay.md section 3; the metrics ``tau``, ``accept_rate``, ``oracle_tau``, ``est_speedup``: sections 4-6.

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
from sglang_histospec.trace.kgrams import PAD, KeySet, kgram_keys, self_occurs

SCHEDULES = ("lockstep", "sequential")
"""Orders of a step's requests (``ReplayConfig.schedule``; docs/replay.md section 3)."""
NEVER = np.iinfo(np.int64).max
"""Round of a k-gram that no open source holds."""


class ReplayDrafter(Protocol):
    """What replay drives; adapters for HistoSpec, RhymeRL, prompt lookup and the peers implement it."""

    name: str
    sources: tuple[str, ...]
    """Sources the drafter may draft from (subset of ``SOURCES``); the oracle uses exactly these."""
    window: int | None
    """History visits of a prompt the drafter keeps (None = all)."""
    live_global: bool
    """True when the open step's responses feed the global source as they are emitted (the peers' live caches)."""
    resets_each_step: bool
    """True when the drafter's global cache is emptied at every step boundary (``--peer-reset step``)."""
    pads_to_budget: bool
    """True when the engine verifies ``budget`` nodes whatever the draft's size (est_speedup charges them)."""

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None: ...
    def extend(self, req_id: str, tokens: list[int]) -> None: ...
    def draft(self, req_id: str, budget: int) -> Draft: ...
    def draft_round(self, req_ids: list[str], budgets: list[int]) -> list[Draft]:
        """One round's drafts in one call, as an engine asks for a batch (``ReplayConfig.batch_drafts``)."""
        ...

    def verified(self, req_id: str, draft: Draft) -> None:
        """The part of the request's last draft that is verified (a round cut may drop nodes)."""
        ...

    def end_round(self) -> None:
        """A round's verify steps are done (a peer inserts what they committed in one batch here)."""
        ...

    def overlap_ns(self) -> int:
        """Of the last round's host time, what an engine runs beside the forward pass (a peer's asynchronous insert):
        left out of the round's host time."""
        ...

    def finish(self, req_id: str, response: list[int]) -> None: ...
    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        """Close ``step``; ``groups`` = (prompt_id, prompt, responses by sample, rewards or None) per prompt."""
        ...

    def budget(self, req_id: str, cap: int) -> int:
        """Budget of the request's next verify step, at most ``cap`` (per-request AIMD lives here)."""
        ...

    def observe(self, req_id: str, drafted: int, accepted: int) -> None: ...
    def calibration_report(self) -> dict | None:
        """How well the drafter's probabilities predicted acceptance (None: it has no probabilities to judge)."""
        ...


class BaseDrafter:
    """Defaults for ``ReplayDrafter``: fixed budget, no-op lifecycle; subclasses override what they need."""

    name = "base"
    sources: tuple[str, ...] = ()
    window: int | None = None
    live_global = False
    resets_each_step = False
    pads_to_budget = False
    """True when the engine verifies ``budget`` nodes whatever the draft's size (est_speedup charges them)."""

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None:
        pass

    def extend(self, req_id: str, tokens: list[int]) -> None:
        pass

    def draft(self, req_id: str, budget: int) -> Draft:
        return Draft.empty()

    def draft_round(self, req_ids: list[str], budgets: list[int]) -> list[Draft]:
        return [self.draft(r, b) for r, b in zip(req_ids, budgets)]

    def verified(self, req_id: str, draft: Draft) -> None:
        pass

    def end_round(self) -> None:
        pass

    def overlap_ns(self) -> int:
        return 0

    def finish(self, req_id: str, response: list[int]) -> None:
        pass

    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        pass

    def budget(self, req_id: str, cap: int) -> int:
        return cap

    def observe(self, req_id: str, drafted: int, accepted: int) -> None:
        pass

    def calibration_report(self) -> dict | None:
        return None


class NoneDrafter(BaseDrafter):
    """No speculation: tau = 1."""

    name = "none"


class RoundCut(Protocol):
    """Which drafted nodes a lockstep round verifies (the adaptive policy of replay/projection.py)."""

    def drafts(self, batch: int) -> bool:
        """Whether a round of ``batch`` requests drafts at all (False: no drafting work, plain verify steps)."""
        ...

    def cut(self, batch: int, drafts: list[Draft], host_ns: int) -> list[Draft]:
        """The verified part of every draft of the round (prefix-closed), given the round's drafting time."""
        ...

    def learn(self, verified: list[Draft], accepted: list[int]) -> None:
        """The round's verified drafts and the nodes each accepted."""
        ...

    def new_step(self) -> None:
        """A training step begins: a new history."""
        ...


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
    schedule: str = "lockstep"
    """"lockstep": a step's requests decode concurrently, one verify step each per round; "sequential": one after
    another, shortest first (docs/replay.md section 3)."""
    max_running: int | None = None
    """Lockstep only: at most this many requests at once, admitted in (prompt, sample) order (None = all)."""
    batch_drafts: bool = False
    """Draft each round in one ``draft_round`` call (as an engine drafts a batch; ``draft_threads`` then apply) and
    record every draft's time as the call's over its requests."""
    record_rounds: bool = False
    """Keep every round's (step, batch, verify rows, host ns) in ``ReplayResult.rounds`` (the projection's input)."""
    cut: RoundCut | None = None
    """Lockstep only: the policy that sizes each round's drafts (None: every draft is verified whole)."""

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or not 0 <= self.budget <= MAX_BUDGET:
            raise ValueError(f"budget={self.budget!r} must be an int in [0, {MAX_BUDGET}]")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if self.max_running is not None and (self.schedule != "lockstep" or self.max_running < 1):
            raise ValueError(
                f"max_running={self.max_running!r} needs schedule='lockstep' and a value >= 1 "
                "(sequential decodes one request at a time; None = all of a step's requests at once)"
            )
        if self.batch < 1:
            raise ValueError(f"batch={self.batch} must be >= 1")
        if self.cut is not None and self.schedule != "lockstep":
            raise ValueError("a round cut (--policy adaptive) needs schedule='lockstep'")
        if self.oracle_sources is not None and not set(self.oracle_sources) <= set(SOURCES):
            raise ValueError(f"oracle_sources={self.oracle_sources!r}: expected names from {SOURCES}")

    @property
    def width(self) -> int | None:
        """Requests decoded at once (None = all of the step's)."""
        return 1 if self.schedule == "sequential" else self.max_running


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
    rounds: list[tuple[int, int, int, int]] = field(default_factory=list)
    """With ``record_rounds``: (step, running requests, verify rows, host ns of drafting and extending) per round."""

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


@dataclass(slots=True)
class Request:
    """One response being decoded: its record, the round it started in and its position after every round."""

    rid: str
    rec: TraceRecord
    start_round: int
    ends: list[int] = field(default_factory=list)
    """ends[j] = tokens emitted after round start_round + j (the last is the response length)."""

    @property
    def pos(self) -> int:
        return self.ends[-1] if self.ends else 0

    def visible_rounds(self, keys: np.ndarray) -> np.ndarray:
        """int64 like ``keys`` (``kgram_keys(prompt + response)``): the first round whose drafts can see each k-gram.

        A k-gram ending at index E of prompt + response is visible from the round after the one that emitted token
        E - 1 (from ``start_round`` when it lies in the prompt). Example: prompt [1], ends [2, 3], start 0: the
        1-gram of response token 0 is visible from round 1, that of token 2 from round 2.
        """
        plen = len(self.rec.prompt)
        kk = np.arange(1, keys.shape[0] + 1)[:, None]
        need = np.arange(keys.shape[1])[None, :] + kk - plen  # response tokens that must be out
        rounds = self.start_round + np.searchsorted(np.asarray(self.ends), need, side="left") + 1
        return np.where(need <= 0, self.start_round, rounds)


class OpenRounds:
    """For the k-grams of a group of requests: the first round a request can see them in another one of the group.

    Built once per step from every request's keys and visible rounds; ``lookup(keys, owner)`` ignores the owner's
    own occurrences (those are its ``self`` source). Example: two requests that both emit k-gram x, visible from
    rounds 3 (owner 0) and 5 (owner 1): owner 0 sees x from round 5, owner 1 from round 3, anyone else from 3.
    """

    def __init__(self, keys: list[np.ndarray], rounds: list[np.ndarray], owners: list[int]) -> None:
        k = np.concatenate([x.ravel() for x in keys]) if keys else np.zeros(0, np.uint64)
        v = np.concatenate([x.ravel() for x in rounds]) if keys else np.zeros(0, np.int64)
        o = np.concatenate([np.full(x.size, w, np.int64) for x, w in zip(keys, owners)]) if keys else v.copy()
        keep = k != PAD
        k, v, o = k[keep], v[keep], o[keep]
        order = np.lexsort((v, o, k))  # by key, then owner, then round: each (key, owner)'s first round first
        k, v, o = k[order], v[order], o[order]
        first = np.ones(len(k), bool)
        first[1:] = (k[1:] != k[:-1]) | (o[1:] != o[:-1])
        k, v, o = k[first], v[first], o[first]
        order = np.lexsort((v, k))  # per key, owners by round: the two earliest come first
        k, v, o = k[order], v[order], o[order]
        head = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1]))) if len(k) else np.zeros(0, np.int64)
        nxt = np.minimum(head + 1, max(len(k) - 1, 0))
        second = (head + 1 < len(k)) & (k[nxt] == k[head]) if len(k) else np.zeros(0, bool)
        self.keys, self.round1, self.owner1 = k[head], v[head], o[head]
        self.round2 = np.where(second, v[nxt], NEVER) if len(k) else np.zeros(0, np.int64)

    def lookup(self, keys: np.ndarray, owner: int) -> np.ndarray:
        """int64 like ``keys``: the first round at which another request of the group holds each key (NEVER)."""
        if len(self.keys) == 0:
            return np.full(keys.shape, NEVER, np.int64)
        idx = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        hit = (self.keys[idx] == keys) & (keys != PAD)
        r = np.where(self.owner1[idx] == owner, self.round2[idx], self.round1[idx])
        return np.where(hit, r, NEVER)


class Oracle:
    """Longest-prefix oracle over the sources a drafter may use (docs/replay.md section 6).

    Sequences are ``prompt + response`` (a superset of what any drafter indexes, so the bound stays valid). The
    open step's sources (``siblings``; ``global`` for live drafters) hold what the replayed requests had emitted
    by the end of the previous round, so the same oracle serves both schedules.
    """

    def __init__(
        self, budget: int, sources: tuple[str, ...], window: int | None, live_global: bool, keep_global: bool = True
    ) -> None:
        bad = set(sources) - set(SOURCES)
        if bad:
            raise ValueError(f"unknown sources {sorted(bad)}; known: {SOURCES}")
        self.kmax = max(budget, 1)
        self.budget = budget
        self.sources = set(sources)
        self.window = window
        self.live_global = live_global
        self.keep_global = keep_global
        self.history: dict[str, deque[KeySet]] = {}
        self.glob = KeySet(self.kmax)

    def step(self, reqs: list[Request]) -> list[int]:
        """Oracle verify steps of every request of a replayed step (same order), then the step becomes history."""
        keys = [kgram_keys(r.rec.prompt + r.rec.response, self.kmax) for r in reqs]
        rounds = [r.visible_rounds(k) for r, k in zip(reqs, keys)]
        tables = self._open_tables(reqs, keys, rounds)
        out = [self._steps(i, r, keys[i], tables) for i, r in enumerate(reqs)]
        self._end_step(reqs, keys)
        return out

    def _open_tables(self, reqs, keys, rounds) -> list[tuple[OpenRounds, set[int]]]:  # noqa: ANN001
        """The open step's sources as (table, request indices that may read it)."""
        out = []
        if "siblings" in self.sources:
            by: dict[str, list[int]] = {}
            for i, r in enumerate(reqs):
                by.setdefault(r.rec.prompt_id, []).append(i)
            for idx in by.values():
                out.append((OpenRounds([keys[i] for i in idx], [rounds[i] for i in idx], idx), set(idx)))
        if "global" in self.sources and self.live_global:
            out.append((OpenRounds(keys, rounds, list(range(len(reqs)))), set(range(len(reqs)))))
        return out

    def _steps(self, i: int, req: Request, keys: np.ndarray, tables) -> int:  # noqa: ANN001
        """Verify steps the oracle needs for request ``i``, starting in its round."""
        rec = req.rec
        n = len(rec.response)
        if n == 0 or self.budget == 0 or not self.sources:
            return n
        rkeys = keys[:, len(rec.prompt) :]
        static = np.zeros(rkeys.shape, dtype=bool)
        if "history" in self.sources:
            for ks in self.history.get(rec.prompt_id, ()):
                static |= ks.contains(rkeys)
        if "global" in self.sources:
            static |= self.glob.contains(rkeys)
        if "self" in self.sources:
            static |= self_occurs(rec.prompt, rec.response, self.kmax, keys)
        first = np.where(static, 0, NEVER)
        for table, readers in tables:
            if i in readers:
                first = np.minimum(first, table.lookup(rkeys, i))
        # a prefix of length k is available at round t when all its k-grams' rounds are <= t
        need = np.maximum.accumulate(first, axis=0).T.copy()  # [n, kmax], non-decreasing along each row
        p, t, steps = 0, req.start_round, 0
        while p < n:
            p += min(int(np.searchsorted(need[p], t, side="right")), self.budget) + 1
            t += 1
            steps += 1
        return steps

    def _end_step(self, reqs: list[Request], keys: list[np.ndarray]) -> None:
        opened: dict[str, KeySet] = {}
        for r, k in zip(reqs, keys):
            opened.setdefault(r.rec.prompt_id, KeySet(self.kmax)).add_keys(k)
        for pid, ks in opened.items():
            self.history.setdefault(pid, deque(maxlen=self.window)).append(ks)
            if "global" in self.sources and self.keep_global:
                self.glob.add_keys_from(ks)


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
    rows: int = 0
    """Verify rows of the current round (a root and the verified nodes per request; padded for ``pads_to_budget``)."""
    host_ns: int = 0
    """The current round's drafter time (drafts, extends, observes, ``end_round``)."""


def _oracle(drafter: ReplayDrafter, cfg: ReplayConfig) -> Oracle | None:
    """The oracle of ``cfg`` over the drafter's sources and window (None when ``cfg.oracle`` is off)."""
    if not cfg.oracle:
        return None
    sources = drafter.sources if cfg.oracle_sources is None else tuple(cfg.oracle_sources)
    window = None if cfg.oracle_all_history else drafter.window
    keep = not drafter.resets_each_step
    return Oracle(cfg.budget, sources, window, drafter.live_global, keep_global=keep)


def admission_order(records: list[TraceRecord], schedule: str) -> list[TraceRecord]:
    """The order in which a step's requests start: ``sibling_order`` (sequential) or (prompt, sample) (lockstep,
    prompts in order of first appearance)."""
    if schedule == "sequential":
        return sibling_order(records)
    first: dict[str, int] = {}
    for r in records:
        first.setdefault(r.prompt_id, len(first))
    return sorted(records, key=lambda r: (first[r.prompt_id], r.sample))


def _verify(drafter: ReplayDrafter, req: Request, d: Draft, b: int, cap: int, res: ReplayResult, tally: _Tally) -> int:
    """Verify ``d`` (drafted with budget ``b``) against ``req``'s recorded tokens, emit, and count; returns the
    accepted nodes."""
    resp, p = req.rec.response, req.pos
    nd = len(d.token_ids)
    if nd > b:
        raise RuntimeError(f"drafter {drafter.name!r} returned {nd} nodes for budget {b}")
    a = accept_length(d, resp, p) if nd else 0
    e = min(a + 1, len(resp) - p)
    t0 = time.perf_counter_ns()
    drafter.extend(req.rid, resp[p : p + e])
    drafter.observe(req.rid, nd, a)
    tally.host_ns += time.perf_counter_ns() - t0
    req.ends.append(p + e)
    res.drafted += nd
    res.accepted += a
    tally.accept_hist[a] += 1
    width = min(b, cap) if drafter.pads_to_budget else nd
    tally.rows += 1 + width
    if tally.costs is not None:
        tally.cost_sum += tally.costs[width]
    return a


def _decode_step(
    drafter: ReplayDrafter,
    st: TraceStep,
    cfg: ReplayConfig,
    res: ReplayResult,
    tally: _Tally,
    bar=None,  # noqa: ANN001
) -> list[Request]:
    """Decode a step's responses in rounds: every running request drafts (from what its sources hold after the
    previous round), then each is verified and extended; finished requests call ``finish`` and free their slot
    for the next one in ``admission_order``. Returns the requests in order of finishing."""
    queue = deque(admission_order(st.records, cfg.schedule))
    width = cfg.width or max(len(queue), 1)
    running: list[Request] = []
    done: list[Request] = []
    rnd = 0
    while queue or running:
        while queue and len(running) < width:
            rec = queue.popleft()
            req = Request(f"{st.step}:{rec.prompt_id}:{rec.sample}", rec, rnd)
            drafter.start(req.rid, rec.prompt_id, rec.prompt)
            (running if rec.response else done).append(req)
            if not rec.response:
                drafter.finish(req.rid, rec.response)
                if bar is not None:
                    bar.update(1)
        _round(drafter, running, cfg, res, tally)
        if cfg.record_rounds:
            res.rounds.append((st.step, len(running), tally.rows, tally.host_ns))
        still = []
        for req in running:
            if req.pos < len(req.rec.response):
                still.append(req)
                continue
            drafter.finish(req.rid, req.rec.response)
            done.append(req)
            if bar is not None:
                bar.update(1)
        running = still
        rnd += 1
    return done


def _round(
    drafter: ReplayDrafter, running: list[Request], cfg: ReplayConfig, res: ReplayResult, tally: _Tally
) -> None:
    """One round: every running request drafts (one ``draft_round`` call with ``batch_drafts``), ``cfg.cut`` sizes
    the drafts, then each is verified and extended; the round's rows and host time go to ``tally``."""
    clock = time.perf_counter_ns
    tally.rows = tally.host_ns = 0
    rids = [req.rid for req in running]
    drafting = cfg.cut is None or cfg.cut.drafts(len(running))
    budgets = [drafter.budget(r, cfg.budget) if drafting else 0 for r in rids]
    if not drafting:
        drafts = [Draft.empty()] * len(rids)
    elif cfg.batch_drafts:
        t0 = clock()
        drafts = drafter.draft_round(rids, budgets)
        tally.host_ns = clock() - t0
        tally.draft_ns.extend([tally.host_ns // max(len(rids), 1)] * len(rids))
    else:
        drafts = []
        for r, b in zip(rids, budgets):
            t0 = clock()
            drafts.append(drafter.draft(r, b))
            tally.draft_ns.append(clock() - t0)
        tally.host_ns = sum(tally.draft_ns[-len(rids) :]) if rids else 0
    if drafting and cfg.cut is not None:
        drafts = cfg.cut.cut(len(running), drafts, tally.host_ns)
        for r, d in zip(rids, drafts):
            drafter.verified(r, d)
    accepted = [_verify(drafter, req, d, b, cfg.budget, res, tally) for req, b, d in zip(running, budgets, drafts)]
    t0 = clock()
    drafter.end_round()
    tally.host_ns += clock() - t0 - drafter.overlap_ns()
    if drafting and cfg.cut is not None:
        cfg.cut.learn(drafts, accepted)


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
    res.calibration = drafter.calibration_report()


def replay(steps: Sequence[TraceStep], drafter: ReplayDrafter, cfg: ReplayConfig) -> ReplayResult:
    """Replay ``steps`` (sorted by step, e.g. from ``load_steps``) with ``drafter``; docs/replay.md section 3.

    Steps in increasing order; within a step the requests decode in rounds (``_decode_step``): all at once or
    ``cfg.max_running`` at a time in (prompt, sample) order (lockstep), or one at a time in the *sibling order*
    (``sibling_order``, sequential). Each verify step drafts at most ``budget`` nodes, accepts the longest root path
    equal to the realized tokens (``accept_length``) and emits it plus the bonus token. After a step the drafter's
    ``end_step`` turns its responses into history. Metrics (``tau``, ``accept_rate``, ``oracle_tau``,
    ``draft_us_p50/p99``, ``est_speedup``): docs/replay.md sections 4-6.
    """
    if any(b.step <= a.step for a, b in zip(steps, steps[1:])):
        raise ValueError("steps must be strictly increasing (use trace.load_steps, which sorts)")
    res = ReplayResult(drafter.name, cfg.budget)
    oracle = _oracle(drafter, cfg)
    costs = [cfg.verify_cost.cost(1 + d, cfg.batch) for d in range(cfg.budget + 1)] if cfg.verify_cost else None
    tally = _Tally([0] * (cfg.budget + 1), costs)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        total = sum(len(s.records) for s in steps)
        bar = tqdm(total=total, unit="resp", desc=f"replay {drafter.name}", leave=False, disable=None)
    t_start = time.perf_counter()
    for st in steps:
        if cfg.cut is not None:
            cfg.cut.new_step()
        reqs = _decode_step(drafter, st, cfg, res, tally, bar)
        drafter.end_step(st.step, _groups(st.records))
        ss = StepStats(st.step, len(reqs), sum(len(r.rec.response) for r in reqs), sum(len(r.ends) for r in reqs))
        if oracle is not None:
            ss.oracle_steps = sum(oracle.step(reqs))
        _add_step(res, ss)
    if bar is not None:
        bar.close()
    res.wall_s = time.perf_counter() - t_start
    _finish(res, tally, drafter)
    return res
