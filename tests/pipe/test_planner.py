"""HistoPipe planner: length predictor, cost model, worker model and placement policies."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.pipe.lengths import LengthEstimate, LengthPredictor, LengthPredictorConfig
from sglang_histospec.pipe.planner import (
    POLICIES,
    Group,
    Planner,
    PlannerConfig,
    defer_threshold,
    in_tail,
    is_outlier,
    length_spread,
    longest_length,
    plan,
)
from sglang_histospec.pipe.worker_cost import CostModel, CostModelConfig
from sglang_histospec.pipe.worker_sim import WorkerSim

UNIT = CostModelConfig(iteration_s=1.0, per_request_s=0.0, per_context_token_s=0.0, prefill_token_s=0.0)


def _predictor(lengths: dict[str, list[int]], step: int = 0) -> LengthPredictor:
    p = LengthPredictor(LengthPredictorConfig(window=2))
    for pid, ns in lengths.items():
        p.add(pid, step, ns)
    return p


# ---- length predictor ----------------------------------------------------------------------------------------
def test_predictor_window_prior_and_online_updates() -> None:
    p = LengthPredictor(LengthPredictorConfig(window=1, quantiles=(0.5, 0.9)))
    assert p.predict("x").mean == 512.0 and not p.predict("x").known  # nothing known: the default
    p.add("a", 0, [100, 300])
    assert p.predict("a").mean == 200.0 and p.predict("a").known
    p.add("a", 1, [50])
    assert p.predict("a").mean == 50.0  # window=1 keeps only the last visit
    p.add("b", 1, [150])
    assert p.predict("new").mean == 100.0  # prior: mean of the prompts' means (50, 150)
    p.observe("b", 2, 250)  # a sibling finished in the running step: the newest visit replaces step 1
    assert p.predict("b").mean == 250.0
    q = LengthPredictor(LengthPredictorConfig(window=3, quantiles=(0.0, 0.5, 1.0)))
    q.add("a", 5, [10, 20])
    q.add("a", 3, [30])  # an older visit arriving late is kept in step order
    est = q.predict("a")
    assert (est.quantile(0.0), est.quantile(0.5), est.quantile(1.0), est.count) == (10, 20, 30, 3)


def test_predictor_tracks_its_error_ratio() -> None:
    p = LengthPredictor(LengthPredictorConfig(window=2))
    assert p.error_ratio(0.9) == 1.0  # nothing came back yet
    p.add("a", 0, [100, 100])
    p.add("a", 1, [150, 50])  # predicted 100 from step 0: ratios 1.5 and 0.5
    p.observe("b", 1, 10)  # first visit: no ratio
    assert p.error_ratio(1.0) == 1.5 and p.error_ratio(0.0) == 0.5


def test_margin_splits_long_groups_finer() -> None:
    cost = CostModel(CostModelConfig(iteration_s=0.01, per_context_token_s=2e-6))
    lengths = {"long": [4000], **{f"s{i}": [300] for i in range(6)}}
    groups = [Group("long", 8)] + [Group(f"s{i}", 8) for i in range(6)]
    predictor = _predictor(lengths)
    for pid in lengths:  # every prompt came back twice as long as predicted
        predictor.add(pid, 1, [2 * lengths[pid][0]])
    plain = Planner(cost, PlannerConfig(policy="histopipe")).plan(2, groups, 6, predictor)
    robust = Planner(cost, PlannerConfig(policy="histopipe", split_error_quantile=0.9)).plan(2, groups, 6, predictor)
    assert robust.check(groups) is None
    assert sum(robust.splits) > sum(plain.splits)


@pytest.mark.parametrize(
    ("args", "match"),
    [(("a", -1, [1]), "step"), (("a", 0, [-3]), "length"), ((7, 0, [1]), "prompt_id"), (("a", 0, [1.5]), "length")],
)
def test_predictor_rejects_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LengthPredictor().add(*args)


# ---- cost model and worker -----------------------------------------------------------------------------------
def test_cost_model_examples() -> None:
    cost = CostModel(UNIT)
    assert cost.solo_time(0, 10) == 10.0
    assert CostModel(CostModelConfig(**{**_fields(UNIT), "tau": 2.0})).solo_time(0, 10) == 5.0
    assert cost.batch_time([(0, 3), (0, 5)]) == 5.0
    one_at_a_time = CostModel(CostModelConfig(**{**_fields(UNIT), "max_running": 1}))
    assert one_at_a_time.lower_bound([(0, 10)] * 4, workers=2) == 20.0


def _fields(cfg: CostModelConfig) -> dict:
    return {name: getattr(cfg, name) for name in cfg.__slots__}


@pytest.mark.parametrize(
    ("field", "value"), [("iteration_s", -1.0), ("max_running", 0), ("tau", 0.5), ("prefill_token_s", math.nan)]
)
def test_cost_model_rejects_bad_config(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        CostModelConfig(**{field: value})


def test_cost_model_fit_recovers_parameters() -> None:
    samples = [(b, ctx, 0.01 + 0.001 * b + 1e-6 * ctx) for b in (1, 4, 16, 64) for ctx in (100, 5000, 40000)]
    cfg = CostModel.fit(samples, max_running=64)
    assert cfg.iteration_s == pytest.approx(0.01) and cfg.per_request_s == pytest.approx(0.001)
    assert cfg.per_context_token_s == pytest.approx(1e-6) and cfg.max_running == 64


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 400)), min_size=1, max_size=12),
    tau=st.sampled_from([1.0, 1.7, 3.0]),
)
def test_worker_sim_matches_closed_form_when_batch_fits(reqs: list[tuple[int, int]], tau: float) -> None:
    cost = CostModel(CostModelConfig(tau=tau))
    w = WorkerSim(cost)
    for i, (p, n) in enumerate(reqs):
        w.submit(i, p, n, at=0.0)
    done = w.advance(math.inf)
    assert sorted(k for k, _ in done) == list(range(len(reqs)))
    assert w.now == pytest.approx(cost.batch_time(reqs), rel=1e-9)
    assert w.busy_s == pytest.approx(w.now) and w.is_idle()


def test_worker_sim_queue_partial_advance_and_remove() -> None:
    cost = CostModel(CostModelConfig(**{**_fields(UNIT), "max_running": 1}))
    w = WorkerSim(cost)
    w.submit("a", 0, 4, at=0.0)
    w.submit("b", 0, 2, at=0.0)  # queued behind a
    assert w.advance(2.5) == [] and w.generated("a") == 2 and w.generated("b") == 0
    assert w.remove("a") == 2  # aborted after 2 tokens; b starts now
    assert w.advance(math.inf) == [("b", 4.0)]
    w.submit("c", 0, 1, at=10.0)  # idle until 10: the gap is not busy time
    assert w.advance(math.inf) == [("c", 11.0)] and w.busy_s == 5.0
    with pytest.raises(ValueError, match="not on this worker"):
        w.remove("zz")


# ---- planner -------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=0, max_size=14),
    lengths=st.lists(st.integers(1, 3000), min_size=14, max_size=14),
    workers=st.integers(1, 6),
    policy=st.sampled_from(POLICIES),
    step=st.integers(0, 5),
    backlog=st.lists(st.floats(0, 50), min_size=6, max_size=6),
    overlap=st.booleans(),
)
def test_every_request_placed_exactly_once(
    sizes: list[int], lengths: list[int], workers: int, policy: str, step: int, backlog: list[float], overlap: bool
) -> None:
    groups = [Group(f"p{i}", n, prompt_len=10 * i) for i, n in enumerate(sizes)]
    # odd prompts unknown; the known ones with two lengths, so that their history has a spread
    predictor = _predictor({f"p{i}": [lengths[i], lengths[13 - i]] for i in range(0, len(sizes), 2)})
    plan = Planner(CostModel(), PlannerConfig(policy=policy, search_iters=8)).plan(
        step, groups, workers, predictor, backlog=backlog[:workers], overlap=overlap
    )
    assert plan.check(groups) is None
    assert len(plan.workers) == workers and len(plan.predicted_finish) == workers
    assert all(1 <= k <= min(workers, g.size) for k, g in zip(plan.splits, groups))


@pytest.mark.parametrize("seed", range(12))
def test_lpt_within_four_thirds_of_brute_force(seed: int) -> None:
    import random

    rng = random.Random(seed)
    workers = rng.choice([2, 3])
    n_groups = rng.randint(workers + 1, 7)
    lengths = {f"p{i}": [rng.randint(1, 100)] for i in range(n_groups)}
    groups = [Group(pid, rng.randint(1, 3)) for pid in lengths]
    # One request at a time per worker: times add up, the classic P||Cmax setting of Graham's bound.
    cost = CostModel(CostModelConfig(**{**_fields(UNIT), "max_running": 1}))
    plan = Planner(cost, PlannerConfig(policy="lpt")).plan(0, groups, workers, _predictor(lengths))
    jobs = [cost.batch_time([(0, lengths[g.prompt_id][0])] * g.size) for g in groups]
    best = min(
        max(sum(j for j, w in zip(jobs, assign) if w == k) for k in range(workers))
        for assign in itertools.product(range(workers), repeat=len(groups))
    )
    assert max(plan.predicted_finish) <= (4 / 3 - 1 / (3 * workers)) * best + 1e-9
    assert max(plan.predicted_finish) >= best - 1e-9


def test_histopipe_alternates_order_across_adjacent_steps() -> None:
    workers = 4
    lengths = {f"p{i}": [100 * (i + 1)] for i in range(workers)}
    groups = [Group(pid, 1) for pid in lengths]
    planner = Planner(CostModel(UNIT), PlannerConfig(policy="histopipe"))
    odd = planner.plan(1, groups, workers, _predictor(lengths)).predicted_finish
    even = planner.plan(2, groups, workers, _predictor(lengths)).predicted_finish
    assert odd == sorted(odd) and odd[0] < odd[-1]  # odd step: short -> long over the workers
    assert even == sorted(even, reverse=True)  # even step: long -> short
    assert [a + b for a, b in zip(odd, even)] == pytest.approx([odd[0] + odd[-1]] * workers)  # pairs even out


def test_histopipe_gives_short_work_to_workers_with_a_backlog() -> None:
    lengths = {"long": [2000], "short": [100]}
    groups = [Group("long", 1), Group("short", 1)]
    plan = Planner(CostModel(), PlannerConfig(policy="histopipe")).plan(
        3, groups, 2, _predictor(lengths), backlog=[5.0, 0.0]
    )
    assert plan.worker_of()[(0, 0)] == 1 and plan.worker_of()[(1, 0)] == 0


def test_tier2_split_evens_predicted_completion() -> None:
    # Attention over long contexts makes a big group slow on one worker: splitting it pays.
    cost = CostModel(CostModelConfig(iteration_s=0.01, per_context_token_s=2e-6))
    lengths = {"long": [4000], **{f"s{i}": [300] for i in range(6)}}
    groups = [Group("long", 8)] + [Group(f"s{i}", 8) for i in range(6)]
    predictor = _predictor(lengths)
    split = Planner(cost, PlannerConfig(policy="histopipe")).plan(0, groups, 4, predictor)
    whole = Planner(cost, PlannerConfig(policy="histopipe", split=False)).plan(0, groups, 4, predictor)
    assert split.check(groups) is None and split.splits[0] > 1 and whole.splits[0] == 1
    spread = max(split.predicted_finish) - min(split.predicted_finish)
    assert max(split.predicted_finish) < 0.8 * max(whole.predicted_finish)
    assert spread < 0.25 * max(split.predicted_finish)


@pytest.mark.parametrize(
    ("length", "spread", "samples", "expected"),
    [
        (100.0, 0.5, 1, 100.0),  # one sample: its mean
        (100.0, 0.0, 8, 100.0),  # no spread: every sample at the mean
        (100.0, 0.5, 8, 180.8),  # median 88.2 x exp(0.5 x 1.434)
        (100.0, 0.5, 2, 118.5),
        (100.0, 2.0, 2, 100.0),  # a median far below the mean: never below the mean
    ],
)
def test_longest_length(length: float, spread: float, samples: int, expected: float) -> None:
    assert longest_length(length, spread, samples) == pytest.approx(expected, abs=0.05)


@pytest.mark.parametrize(
    ("estimate", "expected"),
    [
        (LengthEstimate(100.0, {0.5: 100.0, 0.9: 200.0}, count=4, known=True), math.log(2.0) / 1.2815516),
        (LengthEstimate(100.0, {0.5: 100.0, 0.9: 100.0}, count=4, known=True), 0.0),
        (LengthEstimate(512.0), 0.0),  # no history
        (LengthEstimate(100.0, {0.9: 200.0}, count=4, known=True), 0.0),  # no median configured
    ],
)
def test_length_spread(estimate: LengthEstimate, expected: float) -> None:
    assert length_spread(estimate) == pytest.approx(expected, rel=1e-6)


def test_sync_steps_price_a_piece_at_its_longest_sample_and_split_a_wide_group() -> None:
    # one second per iteration and nothing else: a worker's time is its longest request's length
    planner = Planner(CostModel(UNIT), PlannerConfig(policy="histopipe"))
    assert planner.piece_time(Group("g", 8), 100.0, 8) == 100.0
    assert planner.piece_time(Group("g", 8), 100.0, 8, spread=0.5) == 181.0  # iterations of round(180.8)
    assert planner.piece_time(Group("g", 8), 100.0, 1, spread=0.5) == 100.0
    predictor = _predictor({"wide": [40, 60, 80, 100, 100, 120, 200, 400], "n1": [130] * 8, "n2": [130] * 8})
    groups = [Group("wide", 8), Group("n1", 8), Group("n2", 8)]
    sync = planner.plan(0, groups, 2, predictor)
    overlap = planner.plan(0, groups, 2, predictor, overlap=True)  # priced at the mean
    assert overlap.splits == [1, 1, 1] and sync.splits[0] == 2  # its 8 samples are not 8 x 137.5 tokens: split
    assert sync.check(groups) is None and max(sync.predicted_finish) > max(overlap.predicted_finish)
    lpt = Planner(CostModel(UNIT), PlannerConfig(policy="lpt"))  # lpt stays the classic baseline
    assert lpt.plan(0, groups, 2, predictor).workers == lpt.plan(0, groups, 2, predictor, overlap=True).workers


@pytest.mark.parametrize("target", [3.0, 5.0, 8.0, 100.0, 0.5])
def test_split_sizes_takes_the_fewest_workers_that_fit(target: float) -> None:
    # One request at a time, 1 s per token: a piece of m samples of 1 token takes m seconds.
    cost = CostModel(CostModelConfig(**{**_fields(UNIT), "max_running": 1}))
    planner = Planner(cost)
    sizes = planner.split_sizes(Group("g", 8), 1.0, target, workers=4)
    assert sum(sizes) == 8 and max(sizes) - min(sizes) <= 1
    k = len(sizes)
    fits = [planner.piece_time(Group("g", 8), 1.0, math.ceil(8 / j)) <= target for j in range(1, 5)]
    assert k == (fits.index(True) + 1 if any(fits) else 4)


def test_planner_rejects_bad_input() -> None:
    planner = Planner()
    with pytest.raises(ValueError, match="workers"):
        planner.plan(0, [Group("a", 1)], 0, LengthPredictor())
    with pytest.raises(ValueError, match="backlog"):
        planner.plan(0, [Group("a", 1)], 2, LengthPredictor(), backlog=[0.0])
    with pytest.raises(ValueError, match="size"):
        planner.plan(0, [Group("a", 0)], 2, LengthPredictor())
    with pytest.raises(ValueError, match="policy"):
        PlannerConfig(policy="random")


@pytest.mark.parametrize(
    ("generated", "mean", "p90", "expected"), [(151, 100, 140, True), (150, 100, 140, False), (190, 100, 200, False)]
)
def test_is_outlier(generated: int, mean: float, p90: float, expected: bool) -> None:
    est = LengthEstimate(mean=mean, quantiles={0.9: p90}, count=4, known=True)
    assert is_outlier(generated, est, PlannerConfig()) is expected


@pytest.mark.parametrize(("unfinished", "total", "expected"), [(10, 100, True), (11, 100, False), (0, 0, False)])
def test_in_tail(unfinished: int, total: int, expected: bool) -> None:
    assert in_tail(unfinished, total, PlannerConfig()) is expected


@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    workers=st.integers(1, 6),
    policy=st.sampled_from(POLICIES),
    seen=st.lists(st.integers(1, 3000), min_size=0, max_size=12),
)
@settings(max_examples=60, deadline=None)
def test_plan_call_places_every_request_once_like_the_planner(
    sizes: list[int], workers: int, policy: str, seen: list[int]
) -> None:
    """plan(): each (prompt_id, sample) on exactly one worker; the same placement as Planner with a predictor."""
    prompts = [(f"q{i}", n, 16) for i, n in enumerate(sizes)]
    history = {f"q{i}": [n, n + 10] for i, n in enumerate(seen)}
    placement = plan(5, prompts, workers, history, PlannerConfig(policy=policy))
    placed = [req for reqs in placement.workers for req in reqs]
    assert sorted(placed) == sorted((pid, s) for pid, n, _ in prompts for s in range(n))
    assert len(placement.workers) == workers == len(placement.predicted_finish)
    predictor = LengthPredictor()
    for pid, lengths in history.items():
        predictor.add(pid, 4, lengths)
    direct = Planner(config=PlannerConfig(policy=policy)).plan(5, [Group(*p) for p in prompts], workers, predictor)
    assert placement.plan.workers == direct.workers
    assert plan(5, prompts, workers, predictor, PlannerConfig(policy=policy)).workers == placement.workers


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, [], 2, {}), "prompts is empty"),
        ((0, [("a", 2), ("a", 1)], 2, {}), "distinct"),
        ((0, [("a", 0)], 2, {}), "size"),
        ((0, ["a"], 2, {}), "prompt 'a'"),
        ((-1, [("a", 2)], 2, {}), "step"),
        ((0, [("a", 2)], 0, {}), "workers"),
        ((0, [("a", 2)], 2, [1, 2]), "history"),
        ((0, [("a", 2)], 2, {"a": [-5]}), "length"),
    ],
)
def test_plan_call_rejects_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan(*args)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_deferrals", 0),
        ("max_deferrals", 1.5),
    ],
)
def test_planner_config_rejects_bad_deferral_settings(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PlannerConfig(**{field: value})


@pytest.mark.parametrize(
    ("step_mean", "factor", "threshold"), [(60.0, 2.0, 120.0), (100.0, 2.0, 150.0), (60.0, 3.0, 150.0)]
)
def test_defer_threshold_docstring_example(step_mean: float, factor: float, threshold: float) -> None:
    est = LengthEstimate(100.0, {0.9: 140.0}, count=4, known=True)
    assert defer_threshold(est, PlannerConfig(), step_mean, factor) == threshold
    with pytest.raises(ValueError, match="step_factor"):
        defer_threshold(est, PlannerConfig(), step_mean, 0.0)


def test_plan_call_docstring_example() -> None:
    placement = plan(3, [("a", 2), ("b", 2)], workers=2, history={"a": [900, 1000], "b": [100]})
    assert placement.workers == [[("a", 1)], [("a", 0), ("b", 0), ("b", 1)]]
    assert placement.worker_of()[("b", 0)] == 1
