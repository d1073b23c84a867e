"""HistoPipe planner: place a step's groups of requests on rollout workers from predicted lengths.

A step is a list of :class:`Group` (one prompt, ``size`` samples); a policy (``round-robin``, ``lpt`` or
``histopipe``, RhymeRL's two tiers as we reconstruct them: :class:`Planner`) returns a :class:`StepPlan`, each
worker's requests in start order. :func:`plan` is the entry point for an RL framework's own rollout manager
(docs/serving.md, "HistoPipe without the router"); measured runs: docs/results.md, "HistoPipe".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from sglang_histospec.pipe.lengths import LengthEstimate, LengthPredictor
from sglang_histospec.pipe.worker_cost import CostModel

POLICIES = ("round-robin", "lpt", "histopipe")
DEFER_STEP_FACTOR = {"pipeline": 2.0, "router": 3.0}
"""With one-step overlap, a request in its step's tail is also deferred once it has emitted more than this times
the step's mean predicted length (:func:`defer_threshold`), even when its own history predicted it long: in the
simulator's pipeline (``pipeline``) and in the router (``router``; ``PipeSimConfig.router_gate`` models it).
Measured: docs/results.md, "HistoPipe"."""


@dataclass(frozen=True, slots=True)
class Group:
    """One prompt's ``size`` samples in a step."""

    prompt_id: str
    size: int
    prompt_len: int = 0


@dataclass(slots=True)
class PlannerConfig:
    policy: str = "histopipe"
    """One of ``POLICIES``."""
    length_quantile: float | None = None
    """Predict each request's length by this quantile of its prompt's history (None = the mean)."""
    split: bool = True
    """histopipe tier 2: split long groups over several workers."""
    search_iters: int = 24
    """Binary-search iterations of tier 2 over the target time."""
    split_error_quantile: float | None = None
    """Tier 2 sizes each group's pieces so they fit the target even when the group runs this quantile of the
    predictor's observed actual/predicted ratio longer than predicted (robust to drift); None = as predicted.
    Measured with ``histospec bench pipe`` (2026-12-04): 0.9 lowers idle time with one-step overlap and costs in
    synchronous steps."""
    outlier_factor: float = 1.5
    """A request is an outlier once it has emitted more than this times its predicted mean (and its p90)."""
    tail_fraction: float = 0.10
    """Outliers are acted on only while at most this share of the step's requests is unfinished."""
    max_deferrals: int = 1
    """With one-step overlap: how many times one outlier may be deferred to the next step. Each deferral lets
    its step complete without it, and the response then spans one more weight version (1 = one step off-policy)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"PlannerConfig.policy={self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.length_quantile is not None and not 0.0 <= self.length_quantile <= 1.0:
            raise ValueError(f"PlannerConfig.length_quantile={self.length_quantile!r}: must be in [0, 1] or None")
        if self.split_error_quantile is not None and not 0.0 <= self.split_error_quantile <= 1.0:
            raise ValueError(f"PlannerConfig.split_error_quantile={self.split_error_quantile!r}: in [0, 1] or None")
        if not (isinstance(self.search_iters, int) and self.search_iters >= 0):
            raise ValueError(f"PlannerConfig.search_iters={self.search_iters!r}: must be an int >= 0")
        if not self.outlier_factor >= 1.0:
            raise ValueError(f"PlannerConfig.outlier_factor={self.outlier_factor!r}: must be >= 1")
        if not (isinstance(self.max_deferrals, int) and self.max_deferrals >= 1):
            raise ValueError(f"PlannerConfig.max_deferrals={self.max_deferrals!r}: must be an int >= 1")
        if not 0.0 <= self.tail_fraction <= 1.0:
            raise ValueError(f"PlannerConfig.tail_fraction={self.tail_fraction!r}: must be in [0, 1]")


@dataclass(slots=True)
class StepPlan:
    """Placement and start order of one step's requests."""

    step: int
    policy: str
    workers: list[list[tuple[int, int]]]
    """Per worker, ``(group index, sample index)`` in start order."""
    predicted_finish: list[float]
    """Per worker, predicted time from planning until its work of this step is done (backlog included)."""
    predicted_lengths: list[float] = field(default_factory=list)
    """Per group, the length each of its samples was predicted to have."""
    splits: list[int] = field(default_factory=list)
    """Per group, over how many workers its samples were spread."""

    def worker_of(self) -> dict[tuple[int, int], int]:
        """Map ``(group, sample) -> worker``."""
        return {req: w for w, reqs in enumerate(self.workers) for req in reqs}

    def mean_predicted(self) -> float:
        """Mean predicted length over the step's requests (each group counts its samples)."""
        sizes = [len(reqs) for reqs in self.workers]
        counts: dict[int, int] = {}
        for reqs in self.workers:
            for g, _ in reqs:
                counts[g] = counts.get(g, 0) + 1
        total = sum(sizes)
        return sum(self.predicted_lengths[g] * n for g, n in counts.items()) / total if total else 0.0

    def check(self, groups: Sequence[Group]) -> str | None:
        """Describe the first broken invariant (a request missing, duplicated or unknown), or None."""
        expected = {(g, s) for g, group in enumerate(groups) for s in range(group.size)}
        seen: set[tuple[int, int]] = set()
        for w, reqs in enumerate(self.workers):
            for req in reqs:
                if req in seen:
                    return f"request {req} placed twice (again on worker {w})"
                if req not in expected:
                    return f"request {req} on worker {w} is not in the step"
                seen.add(req)
        missing = expected - seen
        return f"requests not placed: {sorted(missing)[:5]}" if missing else None


_NORMAL = NormalDist()
_Z90 = _NORMAL.inv_cdf(0.9)


def length_spread(estimate: LengthEstimate) -> float:
    """Log-normal spread of a prompt's response lengths read from its history's 0.5 and 0.9 quantiles: ``ln(q90 /
    q50) / z(0.9)``; 0.0 without history or without those quantiles. Example: q50 100, q90 200: about 0.54."""
    q50, q90 = estimate.quantiles.get(0.5), estimate.quantiles.get(0.9)
    if estimate.count == 0 or q50 is None or q90 is None:
        return 0.0
    return max(0.0, math.log(max(q90, 1.0) / max(q50, 1.0)) / _Z90)


def longest_length(length: float, spread: float, samples: int) -> float:
    """Expected longest of ``samples`` log-normal lengths of mean ``length`` and log-spread ``spread``: median x
    exp(spread x z), with median = mean x exp(-spread**2 / 2) and z Blom's approximation of the largest of n normal
    scores; never below the mean. Example: ``longest_length(100, 0.5, 1) == 100``; 8 samples at spread 0.5: about
    181."""
    if samples <= 1 or spread <= 0.0:
        return length
    z = _NORMAL.inv_cdf((samples - 0.375) / (samples + 0.25))
    return max(length, length * math.exp(spread * z - 0.5 * spread * spread))


@dataclass(slots=True)
class _Load:
    """Closed-form predicted time of a worker's requests (see :meth:`CostModel.batch_time`), kept incrementally."""

    backlog: float = 0.0
    prefill: float = 0.0
    own: float = 0.0
    max_iter: int = 0
    sum_iter: int = 0

    def finish(self, cost: CostModel) -> float:
        fixed = max(self.max_iter, math.ceil(self.sum_iter / cost.config.max_running))
        return self.backlog + self.prefill + self.own + cost.config.iteration_s * fixed

    def add(self, cost: CostModel, prompt_len: int, length: int, count: int, spread: float = 0.0) -> None:
        """``count`` requests of predicted ``length``; their longest decodes :func:`longest_length` tokens."""
        it = cost.iterations(length)
        self.prefill += count * cost.prefill_time(prompt_len)
        self.own += count * cost.own_time(prompt_len, length)
        longest = it if spread <= 0.0 else cost.iterations(int(round(longest_length(length, spread, count))))
        self.max_iter = max(self.max_iter, longest)
        self.sum_iter += count * it


class Planner:
    """Plans steps with one policy.

    Example::

        planner = Planner(CostModel(), PlannerConfig(policy="lpt"))
        lengths = LengthPredictor(); lengths.add("a", 0, [900]); lengths.add("b", 0, [100])
        plan = planner.plan(1, [Group("a", 2), Group("b", 2)], workers=2, lengths=lengths)
        plan.workers   # [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]: the long group alone on worker 0

    A step is a list of :class:`Group` (one prompt, ``size`` samples). A policy returns a :class:`StepPlan`: for each
    worker the requests ``(group index, sample index)`` in the order the worker should start them. Policies:

    * ``round-robin``: group i to worker i mod W, in the given order (the usual baseline).
    * ``lpt``: whole groups, longest predicted first, each to the worker predicted to finish first.
    * ``histopipe`` (RhymeRL's two tiers, our reconstruction; the paper's HistoPipe was never released):
      tier 2 splits long groups over k workers, k per group from its cost curve (predicted time of a piece of
      ceil(G/k) samples, non-increasing in k), with a target time found by binary search so that predicted worker
      completions come out even; tier 1 ranks the pieces by predicted cost and deals them longest first to the
      worker predicted to finish first, counting each worker's backlog from the previous step when steps overlap,
      and breaking ties in an order that alternates across adjacent steps (odd steps ascending: the longest work
      goes to the last worker; even steps descending: to the first), so a worker that ran long work in one step
      gets short work in the next. Outliers (:func:`is_outlier`) are moved or deferred by whoever runs the step
      (the simulator, the router).

    Worker time is predicted with :meth:`CostModel.batch_time` from each request's predicted length (the mean of its
    prompt's history, or a quantile).
    """

    def __init__(self, cost: CostModel | None = None, config: PlannerConfig | None = None) -> None:
        self.cost = cost or CostModel()
        self.config = config or PlannerConfig()

    def predict(self, estimate: LengthEstimate) -> float:
        q = self.config.length_quantile
        return estimate.mean if q is None else estimate.quantile(q)

    def plan(
        self,
        step: int,
        groups: Sequence[Group],
        workers: int,
        lengths: LengthPredictor,
        backlog: Sequence[float] | None = None,
        overlap: bool = False,
    ) -> StepPlan:
        """Place every request of ``groups`` on ``workers`` workers.

        ``backlog``: per worker, predicted time until it can start this step (one-step overlap); only
        ``histopipe`` uses it. ``overlap``: the step runs with one-step overlap (then each worker is priced at its
        requests' predicted mean, not at their expected longest). Raises ValueError on an empty step, bad sizes or
        a backlog of the wrong length.
        """
        if not (isinstance(workers, int) and workers >= 1):
            raise ValueError(f"workers={workers!r}: must be an int >= 1")
        for g in groups:
            if not (isinstance(g.size, int) and g.size >= 1) or g.prompt_len < 0:
                raise ValueError(f"group {g.prompt_id!r}: size={g.size!r} must be >= 1, prompt_len >= 0")
        if backlog is None:
            backlog = [0.0] * workers
        if len(backlog) != workers or any(not (b >= 0 and math.isfinite(b)) for b in backlog):
            raise ValueError(f"backlog={list(backlog)!r}: need {workers} finite values >= 0 (one per worker)")
        estimates = [lengths.predict(g.prompt_id) for g in groups]
        predicted = [max(1.0, self.predict(e)) for e in estimates]
        policy = self.config.policy
        spread = policy == "histopipe" and not overlap  # lpt: textbook; overlap: priced at the mean
        spreads = [length_spread(e) if spread else 0.0 for e in estimates]
        if policy == "round-robin":
            pieces = [(i, g.size) for i, g in enumerate(groups)]
            assign = [i % workers for i in range(len(groups))]
            return self._build(step, groups, predicted, spreads, pieces, assign, [0.0] * workers, longest_first=False)
        if policy == "lpt":
            pieces = [(i, g.size) for i, g in enumerate(groups)]
            assign = self._greedy(groups, predicted, spreads, pieces, [0.0] * workers, order=range(workers))
            return self._build(step, groups, predicted, spreads, pieces, assign, [0.0] * workers)
        # histopipe: alternate the tie order across adjacent steps (odd: ascending, longest to the last worker).
        order = range(workers - 1, -1, -1) if step % 2 == 1 else range(workers)
        q = self.config.split_error_quantile
        margin = 1.0 if q is None else max(1.0, lengths.error_ratio(q))
        split = (
            self._split(groups, predicted, spreads, workers, list(backlog), order, margin)
            if self.config.split
            else None
        )
        counts = split or [[g.size] for g in groups]
        pieces = [(i, m) for i, ms in enumerate(counts) for m in ms]
        assign = self._greedy(groups, predicted, spreads, pieces, list(backlog), order)
        return self._build(step, groups, predicted, spreads, pieces, assign, list(backlog))

    # ---- tier 2 ----------------------------------------------------------------------------------------------
    def piece_time(self, group: Group, length: float, samples: int, spread: float = 0.0) -> float:
        """Predicted time of ``samples`` requests of ``group`` alone on a worker (one point of its cost curve);
        ``spread``: the log-spread of their lengths (0 = all of length ``length``)."""
        if spread <= 0.0:
            return self.cost.same_time(group.prompt_len, int(round(length)), samples)
        load = _Load()
        load.add(self.cost, group.prompt_len, int(round(length)), samples, spread)
        return load.finish(self.cost)

    def split_sizes(self, group: Group, length: float, target: float, workers: int, spread: float = 0.0) -> list[int]:
        """Sizes of the pieces of ``group`` for a target time: k = the fewest workers whose pieces fit ``target``.

        k is found by binary search on the non-increasing cost curve k -> piece_time(ceil(G/k)); when even
        k = min(G, workers) does not fit, that k is used. Example: 8 samples, pieces of 3 fit -> k = 3, [3, 3, 2].
        """
        hi = min(group.size, workers)
        lo = 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.piece_time(group, length, math.ceil(group.size / mid), spread) <= target:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        base, extra = divmod(group.size, k)
        return [base + (1 if j < extra else 0) for j in range(k)]

    def _split(
        self,
        groups: Sequence[Group],
        predicted: list[float],
        spreads: Sequence[float],
        workers: int,
        backlog: list[float],
        order: Sequence[int],
        margin: float = 1.0,
    ) -> list[list[int]] | None:
        """Binary search on the target time; returns the piece sizes with the smallest predicted makespan.

        Pieces are sized for lengths ``margin`` times the prediction (see ``split_error_quantile``) and priced with
        the groups' ``spreads`` (0 = every sample at its group's prediction).
        """
        if not groups:
            return None
        per = list(zip(groups, predicted, spreads))
        lo = max(self.piece_time(g, n, math.ceil(g.size / min(g.size, workers)), s) for g, n, s in per)
        hi = max(self.piece_time(g, n, g.size, s) for g, n, s in per)
        best: tuple[float, list[list[int]]] | None = None
        for _ in range(self.config.search_iters + 1):
            target = (lo + hi) / 2 if best is not None else hi
            counts = [self.split_sizes(g, n * margin, target, workers, s) for g, n, s in per]
            pieces = [(i, m) for i, ms in enumerate(counts) for m in ms]
            assign = self._greedy(groups, predicted, spreads, pieces, list(backlog), order)
            loads = self._loads(groups, predicted, spreads, pieces, assign, backlog)
            makespan = max(load.finish(self.cost) for load in loads)
            if best is None or makespan < best[0] - 1e-12:
                best = (makespan, counts)
            if best is not None and target != hi:
                if makespan <= target + max(backlog, default=0.0):
                    hi = target
                else:
                    lo = target
            if hi - lo <= 1e-3 * hi:
                break
        return best[1] if best else None

    # ---- tier 1 / lpt ----------------------------------------------------------------------------------------
    def _greedy(
        self,
        groups: Sequence[Group],
        predicted: list[float],
        spreads: Sequence[float],
        pieces: Sequence[tuple[int, int]],
        backlog: list[float],
        order: Sequence[int],
    ) -> list[int]:
        """Longest piece first onto the worker predicted to finish first; ties by position in ``order``."""
        rank = {w: r for r, w in enumerate(order)}
        loads = [_Load(backlog=b) for b in backlog]
        heap = [(loads[w].finish(self.cost), rank[w], w) for w in order]
        heapq.heapify(heap)
        by_cost = sorted(
            range(len(pieces)),
            key=lambda j: (
                -self.piece_time(groups[pieces[j][0]], predicted[pieces[j][0]], pieces[j][1], spreads[pieces[j][0]]),
                j,
            ),
        )
        assign = [0] * len(pieces)
        for j in by_cost:
            i, m = pieces[j]
            _, r, w = heapq.heappop(heap)
            loads[w].add(self.cost, groups[i].prompt_len, int(round(predicted[i])), m, spreads[i])
            assign[j] = w
            heapq.heappush(heap, (loads[w].finish(self.cost), r, w))
        return assign

    def _loads(
        self,
        groups: Sequence[Group],
        predicted: list[float],
        spreads: Sequence[float],
        pieces: Sequence[tuple[int, int]],
        assign: Sequence[int],
        backlog: Sequence[float],
    ) -> list[_Load]:
        loads = [_Load(backlog=b) for b in backlog]
        for (i, m), w in zip(pieces, assign):
            loads[w].add(self.cost, groups[i].prompt_len, int(round(predicted[i])), m, spreads[i])
        return loads

    def _build(
        self,
        step: int,
        groups: Sequence[Group],
        predicted: list[float],
        spreads: Sequence[float],
        pieces: Sequence[tuple[int, int]],
        assign: Sequence[int],
        backlog: list[float],
        longest_first: bool = True,
    ) -> StepPlan:
        """Turn pieces ``(group, samples)`` and their workers into per-worker request lists."""
        out: list[list[tuple[int, int]]] = [[] for _ in backlog]
        next_sample = [0] * len(groups)
        spread: list[set[int]] = [set() for _ in groups]
        for (i, m), w in zip(pieces, assign):
            out[w].extend((i, s) for s in range(next_sample[i], next_sample[i] + m))
            next_sample[i] += m
            spread[i].add(w)
        if longest_first:
            for reqs in out:
                reqs.sort(key=lambda r: (-predicted[r[0]], r))
        loads = self._loads(groups, predicted, spreads, pieces, assign, backlog)
        return StepPlan(
            step=step,
            policy=self.config.policy,
            workers=out,
            predicted_finish=[load.finish(self.cost) for load in loads],
            predicted_lengths=predicted,
            splits=[len(s) for s in spread],
        )


def is_outlier(generated: int, estimate: LengthEstimate, config: PlannerConfig) -> bool:
    """True when a running request has emitted well past its prediction (``outlier_factor`` x mean, and p90).

    Example: mean 100, p90 140, factor 1.5: 151 tokens emitted -> True, 150 -> False.
    """
    return generated > outlier_threshold(estimate, config)


def outlier_threshold(estimate: LengthEstimate, config: PlannerConfig) -> float:
    """Tokens beyond which a request is an outlier: max(outlier_factor x mean, p90) of its prompt's history."""
    return max(config.outlier_factor * estimate.mean, estimate.quantile(0.9))


def defer_threshold(estimate: LengthEstimate, config: PlannerConfig, step_mean: float, step_factor: float) -> float:
    """Tokens past which one-step overlap defers a running request: :func:`outlier_threshold`, at most
    ``step_factor`` x ``step_mean`` (the mean predicted length of the request's step; ``DEFER_STEP_FACTOR``).

    Example: mean 100, p90 140, factor 1.5: with ``step_factor=2`` and a step mean of 60: 120; of 100: 150.
    """
    if not step_factor > 0:
        raise ValueError(f"step_factor={step_factor!r}: must be > 0 (see DEFER_STEP_FACTOR)")
    return min(outlier_threshold(estimate, config), step_factor * step_mean)


def remaining_length(estimate: LengthEstimate, emitted: float) -> int:
    """Predicted tokens a running request still emits after ``emitted``: its prompt's mean minus what it emitted,
    at least a tenth of the mean (it has outrun its prediction) and 1.

    Example: mean 100: 60 after 40 emitted, 10 after 150.
    """
    return int(max(estimate.mean - emitted, 0.1 * estimate.mean, 1))


def in_tail(unfinished: int, total: int, config: PlannerConfig) -> bool:
    """True once at most ``tail_fraction`` of the step's ``total`` requests are unfinished."""
    return total > 0 and unfinished <= config.tail_fraction * total


@dataclass(slots=True)
class Placement:
    """Where an RL framework's rollout manager should send a step's requests (:func:`plan`)."""

    workers: list[list[tuple[str, int]]]
    """Per worker, ``(prompt_id, sample index)`` in the order to start them."""
    predicted_finish: list[float]
    """Per worker, predicted seconds until its share is done (backlog included)."""
    plan: StepPlan
    """The planner's full answer (group indices instead of prompt ids, predicted lengths, splits)."""

    def worker_of(self) -> dict[tuple[str, int], int]:
        """Map ``(prompt_id, sample) -> worker``."""
        return {req: w for w, reqs in enumerate(self.workers) for req in reqs}


def plan(
    step: int,
    prompts: Sequence[Group | tuple[str, int] | tuple[str, int, int]],
    workers: int,
    history: LengthPredictor | Mapping[str, Sequence[int]],
    config: PlannerConfig | None = None,
    cost: CostModel | None = None,
    backlog: Sequence[float] | None = None,
    overlap: bool = False,
) -> Placement:
    """Place one step's requests on ``workers`` rollout workers without the router (for verl, slime, AReaL...).

    ``prompts``: per prompt ``Group`` or ``(prompt_id, samples[, prompt_len])``, each prompt id once.
    ``history``: a :class:`LengthPredictor` kept across steps (feed it with ``add(prompt_id, step, lengths)``)
    or a plain ``{prompt_id: [response lengths seen before]}``. ``backlog``: per worker, seconds of work still
    queued from the previous step; ``overlap``: the step runs with one-step overlap. Example::

        placement = plan(3, [("a", 2), ("b", 2)], workers=2, history={"a": [900, 1000], "b": [100]})
        placement.workers   # [[("a", 1)], [("a", 0), ("b", 0), ("b", 1)]]: the long group split
    """
    groups = [_as_group(p) for p in prompts]
    if not groups:
        raise ValueError("prompts is empty: give at least one (prompt_id, samples)")
    ids = [g.prompt_id for g in groups]
    if len(set(ids)) != len(ids):
        raise ValueError(f"prompts: prompt ids must be distinct, {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
    if not (isinstance(step, int) and step >= 0):
        raise ValueError(f"step={step!r}: must be an int >= 0")
    predictor = history if isinstance(history, LengthPredictor) else _predictor_from(history, step)
    step_plan = Planner(cost, config).plan(step, groups, workers, predictor, backlog=backlog, overlap=overlap)
    placed = [[(groups[g].prompt_id, s) for g, s in reqs] for reqs in step_plan.workers]
    return Placement(placed, list(step_plan.predicted_finish), step_plan)


def _as_group(p: object) -> Group:
    if isinstance(p, Group):
        return p
    if isinstance(p, tuple) and len(p) in (2, 3) and isinstance(p[0], str):
        return Group(*p)  # type: ignore[arg-type]
    raise ValueError(f"prompt {p!r}: give a Group or (prompt_id: str, samples: int[, prompt_len: int])")


def _predictor_from(history: Mapping[str, Sequence[int]], step: int) -> LengthPredictor:
    """A predictor holding ``history`` as one earlier visit per prompt."""
    if not isinstance(history, Mapping):
        raise ValueError(f"history is a {type(history).__name__}: give a LengthPredictor or {{prompt_id: [lengths]}}")
    predictor = LengthPredictor()
    for pid, lengths in history.items():
        predictor.add(pid, max(0, step - 1), list(lengths))
    return predictor
