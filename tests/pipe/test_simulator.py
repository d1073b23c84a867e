"""HistoPipe simulator: conservation, bounds, policies on long-tailed synthetic traces, migration, deferral, CLI."""

from __future__ import annotations

import json
from functools import cache

import pytest

from sglang_histospec.pipe.lengths import LengthPredictor
from sglang_histospec.pipe.planner import POLICIES, Group, PlannerConfig
from sglang_histospec.pipe.simulator import (
    PipeSimConfig,
    PipeSimulator,
    StepWork,
    gate_bound,
    workload_from_trace,
)
from sglang_histospec.pipe.worker_cost import CostModel, CostModelConfig
from sglang_histospec.trace.format import TraceStep
from sglang_histospec.trace.synth import SynthConfig, generate

UNIT = CostModelConfig(iteration_s=1.0, per_request_s=0.0, per_context_token_s=0.0, prefill_token_s=0.0)
# Attention over long contexts costs: a worker crowded with long requests is slower than one running a few.
HEAVY = CostModelConfig(iteration_s=0.01, per_request_s=1e-4, per_context_token_s=2e-6, prefill_token_s=1e-5)


@cache
def _long_tailed(prompts: int = 48, epochs: int = 4, seed: int = 0) -> tuple[StepWork, ...]:
    """A small synthetic trace with long-tailed lengths (log-normal sigma 1), two steps per epoch."""
    cfg = SynthConfig(
        prompts=prompts, group_size=8, epochs=epochs, steps_per_epoch=2, mean_len=48, length_sigma=1.0,
        max_len=1024, vocab=300, prompt_len=16, seed=seed,
    )  # fmt: skip
    by_step: dict[int, TraceStep] = {}
    for rec in generate(cfg):
        by_step.setdefault(rec.step, TraceStep(rec.step)).records.append(rec)
    return tuple(workload_from_trace([by_step[s] for s in sorted(by_step)], length_scale=4))


def _sim(policy: str, workers: int, overlap: bool = False, cost: CostModelConfig | None = None, **kw) -> PipeSimulator:
    sim = {k: kw.pop(k) for k in ("outliers", "router_gate") if k in kw}
    return PipeSimulator(
        PipeSimConfig(workers=workers, overlap=overlap, **sim),
        PlannerConfig(policy=policy, **kw),
        CostModel(cost or CostModelConfig()),
    )


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_finishes_once_and_the_bound_holds(policy: str, overlap: bool) -> None:
    steps = _long_tailed()
    result = _sim(policy, 4, overlap).run(steps)
    assert sum(s.requests for s in result.per_step) == sum(len(w.requests()) for w in steps)
    assert len(result.per_step) == len(steps)
    assert result.makespan >= result.lower_bound > 0
    assert 0.0 <= result.idle_fraction < 1.0 and 0.0 <= result.tail_share <= 1.0
    assert result.steady_idle_fraction is None or 0.0 <= result.steady_idle_fraction < 1.0
    if not overlap:
        for s in result.per_step:
            assert s.makespan >= s.lower_bound * (1 - 1e-9)
    out = result.to_json()
    for key in ("policy", "workers", "steps", "makespan", "lower_bound", "idle_fraction", "tail_share", "migrations"):
        assert key in out
    json.dumps(out)


def test_histopipe_beats_round_robin_on_long_tailed_lengths() -> None:
    steps = _long_tailed()
    rr = _sim("round-robin", 8, cost=HEAVY).run(steps)
    hp = _sim("histopipe", 8, cost=HEAVY).run(steps)
    assert hp.makespan < rr.makespan
    assert hp.idle_fraction < rr.idle_fraction
    assert hp.makespan / hp.lower_bound < rr.makespan / rr.lower_bound
    # One-step overlap lets workers run ahead: less idle time and a shorter run, one step off-policy.
    ov = _sim("histopipe", 8, overlap=True, cost=HEAVY).run(steps)
    assert ov.makespan < hp.makespan and ov.idle_fraction < hp.idle_fraction


def test_oracle_plans_with_realized_lengths() -> None:
    steps = _long_tailed()
    oracle = _sim("histopipe", 8, cost=HEAVY)
    oracle.config.oracle = True
    result = oracle.run(steps)
    history = _sim("histopipe", 8, cost=HEAVY).run(steps)
    assert all(s.history_share == 1.0 for s in result.per_step)  # every step planned with known lengths
    assert history.per_step[0].history_share == 0.0 and history.to_json()["warm_steps"] < len(steps)
    assert result.warm_bound_gap() is not None and result.warm_bound_gap() < history.warm_bound_gap()


def test_hand_computed_step() -> None:
    # 1 s per iteration: worker 0 runs the 900/800 group (900 s), worker 1 the eight 100-token samples (100 s).
    work = [StepWork(0, [Group("a", 2), Group("b", 8)], [[900, 800], [100] * 8])]
    predictor = LengthPredictor()
    predictor.add("a", 0, [850])
    predictor.add("b", 0, [110])
    result = _sim("lpt", 2, cost=UNIT).run(work, predictor=predictor)
    assert result.makespan == 900.0 and result.lower_bound == 900.0
    assert result.idle_fraction == pytest.approx(1 - (900 + 100) / 1800)
    assert result.per_step[0].tail_s == pytest.approx(900 - 800)  # 9 of 10 requests done at 800 s
    assert result.tail_share == pytest.approx(100 / 900)
    assert result.migrations == 0


def test_outlier_is_migrated_with_its_partial_output() -> None:
    # Both samples of "a" were predicted at 10 tokens and run to 3000 on one worker; once 2 of 4 requests are left
    # (tail_fraction 0.5) one of them moves to the idle worker. Kept partial output: it does not restart.
    work = [StepWork(1, [Group("a", 2, 64), Group("b", 2, 64)], [[3000, 3000], [10, 10]])]

    def run(outliers: bool):
        predictor = LengthPredictor()
        predictor.add("a", 0, [10, 10])
        predictor.add("b", 0, [10, 10])
        sim = _sim("lpt", 2, cost=HEAVY, tail_fraction=0.5, outliers=outliers)
        return sim.run(work, predictor=predictor)

    moved, stayed = run(True), run(False)
    assert moved.migrations == 1 and stayed.migrations == 0
    assert moved.makespan < stayed.makespan
    solo = CostModel(HEAVY).solo_time(64, 3000)
    assert moved.makespan < 1.1 * solo  # a restart from scratch would take more than the solo time again


def test_overlap_defers_outliers_to_the_next_step() -> None:
    predictor = LengthPredictor()
    for pid in ("a", "b", "c"):
        predictor.add(pid, 0, [10, 10])
    work = [
        StepWork(1, [Group("a", 2), Group("b", 2)], [[3000, 10], [10, 10]]),
        StepWork(2, [Group("c", 2)], [[10, 10]]),
    ]
    sim = _sim("histopipe", 2, overlap=True, cost=HEAVY, tail_fraction=0.25)
    result = sim.run(work, predictor=predictor)
    assert result.migrations == 1
    assert [s.requests for s in result.per_step] == [3, 3]  # the outlier finished as part of step 2
    sync = _sim("histopipe", 2, cost=HEAVY, tail_fraction=0.25, outliers=False).run(work, predictor=predictor)
    assert result.per_step[0].end < sync.per_step[0].end


@pytest.mark.parametrize(("router_gate", "makespan"), [(False, 3384.0), (True, 3000.0)])
def test_a_deferred_request_that_stays_is_not_paused(router_gate: bool, makespan: float) -> None:
    # 1 s per iteration, round-robin: worker 0 runs "a" (an outlier: 3000 tokens, history 10) and "d" (400), worker
    # 1 "b" (400) and "e" (10). "a" is deferred at 16 s while both workers are still on step 1: the pipeline queues
    # it at the head of worker 0's next share (it resumes when "d" ends at 400 s); the router's runs on.
    predictor = LengthPredictor()
    for pid, n in (("a", 10), ("b", 400), ("d", 400), ("e", 10), ("c", 10)):
        predictor.add(pid, 0, [n, n])
    work = [
        StepWork(1, [Group("a", 1), Group("b", 1), Group("d", 1), Group("e", 1)], [[3000], [400], [400], [10]]),
        StepWork(2, [Group("c", 2)], [[10, 10]]),
    ]
    sim = _sim("round-robin", 2, overlap=True, cost=UNIT, tail_fraction=0.75, router_gate=router_gate)
    result = sim.run(work, predictor=predictor)
    assert result.migrations == 1 and [s.requests for s in result.per_step] == [3, 3]
    assert result.per_step[0].end == 400.0 and result.makespan == makespan


@pytest.mark.parametrize(
    ("max_deferrals", "moves", "requests"), [(1, 1, [2, 3, 2]), (2, 2, [2, 2, 3]), (5, 2, [2, 2, 3])]
)
def test_max_deferrals_lets_a_long_outlier_skip_several_steps(max_deferrals, moves, requests) -> None:
    """An outlier of 30000 tokens (history: 10) is deferred once per step it would hold up, up to max_deferrals
    (never out of the last step)."""
    predictor = LengthPredictor()
    for pid in "abcdef":
        predictor.add(pid, 0, [10, 10])
    work = [
        StepWork(1, [Group("a", 1), Group("b", 2)], [[30000], [10, 10]]),
        StepWork(2, [Group("c", 1), Group("d", 1)], [[10], [10]]),
        StepWork(3, [Group("e", 1), Group("f", 1)], [[10], [10]]),
    ]
    sim = _sim("histopipe", 2, overlap=True, cost=HEAVY, tail_fraction=0.4, max_deferrals=max_deferrals)
    result = sim.run(work, predictor=predictor)
    assert result.migrations == moves
    assert [s.requests for s in result.per_step] == requests  # the outlier finished as part of that step


@pytest.mark.parametrize(("router_gate", "moves"), [(False, 1), (True, 0)])
def test_defer_step_factor_defers_a_predicted_long_straggler(router_gate: bool, moves: int) -> None:
    """ "L" is predicted long by its own history (3000 tokens; not an outlier) and runs 2000; the step's mean
    predicted length is 757.5, so the pipeline (DEFER_STEP_FACTOR 2: past 1515 tokens) defers it and its step
    completes without it; the router's factor 3 (2272.5 tokens) lets it finish in its step."""
    predictor = LengthPredictor()
    predictor.add("L", 0, [3000])
    for pid in "sc":
        predictor.add(pid, 0, [10, 10])
    work = [
        StepWork(1, [Group("L", 1), Group("s", 3)], [[2000], [10, 10, 10]]),
        StepWork(2, [Group("c", 2)], [[10, 10]]),
    ]
    sim = _sim("histopipe", 2, overlap=True, cost=HEAVY, tail_fraction=0.25, router_gate=router_gate)
    result = sim.run(work, predictor=predictor)
    assert result.migrations == moves
    solo = CostModel(HEAVY).solo_time(0, 2000)
    assert (result.per_step[0].end < 0.9 * solo) == bool(moves)


def _last_step_straggler(outliers: bool):
    """Step 2 (the last, nothing to defer to) runs "a" (predicted 100, runs 400-1000) on worker 0 and "b" (100) on
    worker 1, which then idles: with ``outliers`` one of a's stragglers moves there and decodes without
    batch-mates."""
    predictor = LengthPredictor()
    for pid in "ab":
        predictor.add(pid, 0, [100] * 4)
    work = [StepWork(1, [Group("a", 4), Group("b", 4)], [[100] * 4, [100] * 4])]
    work.append(StepWork(2, [Group("a", 4), Group("b", 4)], [[1000, 400, 400, 400], [100] * 4]))
    cost = CostModelConfig(iteration_s=0.01, per_request_s=0.01, per_context_token_s=0.0, prefill_token_s=0.0)
    sim = _sim("round-robin", 2, overlap=True, cost=cost, tail_fraction=0.5, outliers=outliers)
    return sim.run(work, predictor=predictor)


def test_the_pipeline_moves_a_last_step_straggler_to_an_idle_worker() -> None:
    off, drain = _last_step_straggler(False), _last_step_straggler(True)
    assert off.migrations == 0 and drain.migrations == 1
    assert [s.requests for s in drain.per_step] == [8, 8]
    assert drain.makespan < off.makespan and drain.idle_fraction < off.idle_fraction


@pytest.mark.parametrize(("router_gate", "makespan"), [(False, 3000.0), (True, 3100.0)])
def test_a_waiting_worker_steals_the_unstarted_share_of_a_late_one(router_gate: bool, makespan: float) -> None:
    # 1 s per iteration, round-robin: worker 0 runs "a" (3000 s) then would run "c"; worker 1 runs "b", then "d",
    # and is done at 110 s. The pipeline's worker 1 takes both of c's requests (worker 0 is predicted busy until
    # 3000 s); the router starts step 2 once step 1 is complete and does not steal.
    predictor = LengthPredictor()
    for pid, n in (("a", 3000), ("b", 10), ("c", 100), ("d", 100)):
        predictor.add(pid, 0, [n, n])
    work = [
        StepWork(1, [Group("a", 2), Group("b", 2)], [[3000, 3000], [10, 10]]),
        StepWork(2, [Group("c", 2), Group("d", 2)], [[100, 100], [100, 100]]),
    ]
    sim = _sim("round-robin", 2, overlap=True, cost=UNIT, outliers=False, router_gate=router_gate)
    result = sim.run(work, predictor=predictor)
    assert result.makespan == makespan and [s.requests for s in result.per_step] == [4, 4]


@pytest.mark.parametrize(("router_gate", "makespan"), [(False, 110.0), (True, 200.0)])
def test_router_gate_starts_a_step_when_the_last_one_is_complete(router_gate: bool, makespan: float) -> None:
    # 1 s per iteration, round-robin: worker 0 runs "a" (10) then "c" (100), worker 1 "b" (100) then "d" (10).
    # The pipeline lets worker 0 start "c" at 10 s; the router's gate holds it until step 1 completes at 100 s.
    predictor = LengthPredictor()
    for pid, n in (("a", 10), ("b", 100), ("c", 100), ("d", 10)):
        predictor.add(pid, 0, [n])
    work = [
        StepWork(1, [Group("a", 1), Group("b", 1)], [[10], [100]]),
        StepWork(2, [Group("c", 1), Group("d", 1)], [[100], [10]]),
    ]
    sim = PipeSimulator(
        PipeSimConfig(workers=2, overlap=True, outliers=False, router_gate=router_gate),
        PlannerConfig(policy="round-robin"),
        CostModel(UNIT),
    )
    result = sim.run(work, predictor=predictor)
    assert result.makespan == makespan and [s.requests for s in result.per_step] == [2, 2]


@pytest.mark.parametrize("router_gate", [False, True])
@pytest.mark.parametrize("max_deferrals", [1, 2])
def test_pipeline_and_router_finish_each_request_once(router_gate: bool, max_deferrals: int) -> None:
    steps = _long_tailed()
    result = _sim("histopipe", 4, overlap=True, router_gate=router_gate, max_deferrals=max_deferrals).run(steps)
    assert sum(s.requests for s in result.per_step) == sum(len(w.requests()) for w in steps)
    assert result.makespan >= result.lower_bound > 0 and 0.0 <= result.idle_floor <= result.idle_fraction + 1e-9


@pytest.mark.parametrize(
    ("longest", "deferrals", "bound"),
    [
        ([10, 10, 10, 10], 1, 20.0),  # step 3 waits for step 1, which holds step 0's request
        ([10, 10, 10, 10], 0, 20.0),
        ([10, 10, 10, 10], 3, 10.0),  # every request may wait for the last step
        ([10] * 6, 0, 30.0),  # step s + 2 starts after step s: three chained steps
        ([10] * 6, 1, 20.0),
        ([5, 40, 5], 1, 40.0),
        ([], 1, 0.0),
    ],
)
def test_gate_bound_table(longest, deferrals, bound) -> None:
    assert gate_bound(longest, deferrals) == bound


@pytest.mark.parametrize(("longest", "deferrals", "match"), [([1.0], -1, "deferrals"), ([float("nan")], 1, "longest")])
def test_gate_bound_rejects_bad_input(longest, deferrals, match) -> None:
    with pytest.raises(ValueError, match=match):
        gate_bound(longest, deferrals)


def test_step_work_rejects_bad_lengths() -> None:
    with pytest.raises(ValueError, match="lengths"):
        StepWork(0, [Group("a", 2)], [[5]])
    with pytest.raises(ValueError, match="length_scale"):
        workload_from_trace([], length_scale=0)
    with pytest.raises(ValueError, match="workers"):
        PipeSimConfig(workers=0)


def test_cli_pipe_simulate_json(tmp_path, capsys) -> None:  # noqa: ANN001
    from sglang_histospec.cli import main
    from sglang_histospec.trace.synth import write_synthetic

    trace = tmp_path / "t.jsonl.gz"
    write_synthetic(str(trace), SynthConfig(prompts=12, group_size=4, epochs=2, mean_len=24, vocab=200, seed=3))
    png = tmp_path / "steps.png"
    argv = ["pipe", "simulate", str(trace), "--workers", "3", "--policy", "histopipe", "--json", "--plot", str(png)]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["policy"] == "histopipe" and out["workers"] == 3 and out["steps"] == 2
    assert out["makespan"] >= out["lower_bound"] > 0 and png.stat().st_size > 0
    assert main(["pipe", "simulate", str(tmp_path / "missing.jsonl"), "--json"]) == 2


def test_cli_bench_pipe_json(capsys) -> None:  # noqa: ANN001
    from sglang_histospec.cli import main

    argv = ["bench", "pipe", "--workers", "2", "--prompts-per-worker", "2", "--group-size", "4", "--epochs", "2"]
    assert main([*argv, "--mean-len", "16", "--length-scale", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {(r["policy"], r["overlap"]) for r in out["results"]}
    assert rows == {(p, o) for p in (*POLICIES, "histopipe-oracle") for o in (False, True)}
    assert all(r["makespan"] >= r["lower_bound"] > 0 for r in out["results"])
    assert "histopipe_sync_idle" in out["summary"]["2"]


# ---- measured timelines (pipe/timeline.py) -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("intervals", "length"),
    [([], 0.0), ([(0, 2), (1, 3), (5, 6)], 4.0), ([(0, 5), (1, 2)], 5.0), ([(1, 1)], 0.0), ([(2, 3), (0, 1)], 2.0)],
)
def test_busy_length_is_the_union(intervals, length):
    from sglang_histospec.pipe.timeline import busy_length

    assert busy_length(intervals) == length


def test_measure_step_example_and_validation():
    from sglang_histospec.pipe.timeline import StepTimes, measure_step

    got = measure_step({0: [(0.0, 4.0), (1.0, 2.0)], 1: [(0.0, 1.0), (3.0, 4.0)]}, workers=2)
    assert got == StepTimes(0.0, 4.0, 4.0, 6.0, 2.0)
    assert measure_step({0: [(1.0, 3.0)]}, workers=3).idle_s == 4.0  # two workers with nothing: idle all along
    for by_worker, workers, match in [
        ({}, 1, "no request"),
        ({2: [(0, 1)]}, 2, "outside"),
        ({0: [(2, 1)]}, 1, "start"),
    ]:
        with pytest.raises(ValueError, match=match):
            measure_step(by_worker, workers)


# ---- histospec bench pipe-servers --------------------------------------------------------------------------
def test_bench_pipe_servers_helpers() -> None:
    from sglang_histospec.commands.bench_pipe_servers import _summary, _warm_steps

    work = [StepWork(i, [Group(p, 1)], [[5]]) for i, p in enumerate("abab")]
    assert _warm_steps(work) == [2, 3]
    repeats = [{"makespan": 4.0, "idle_fraction": 0.1, "migrations": 1, "per_step": [{"makespan": 1.0}] * 4}] * 2
    row = _summary(repeats, {"makespan": 5.0, "per_step": [1.0, 1.0, 2.0, 1.0]}, [2, 3])
    assert row["warm_makespan"] == 2.0 and row["sim_warm_makespan"] == 3.0 and row["sim_over_measured"] == 1.25


def test_cli_bench_pipe_servers_refuses_bad_flags(capsys) -> None:  # noqa: ANN001
    from sglang_histospec.cli import main

    assert main(["bench", "pipe-servers", "--policies", "nope"]) == 2
    assert main(["bench", "pipe-servers", "--policies", "histopipe-mean"]) == 2
    assert main(["bench", "pipe-servers", "--servers", "0"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [[], ["--overlap"]])
def test_cli_bench_pipe_servers_end_to_end(tmp_path, capsys, overlap) -> None:  # noqa: ANN001
    """Two real servers (tiny model), two short steps: every figure present, measured and simulated; each request
    answered once (checked inside), with one-step overlap too."""
    from sglang_histospec.cli import main
    from sglang_histospec.trace.synth import write_synthetic
    from tests.helpers.tiny import make_tiny_model_dir

    model = make_tiny_model_dir(tmp_path / "m", arch="llama", vocab_size=64, seed=0)
    trace = tmp_path / "t.jsonl.gz"
    write_synthetic(str(trace), SynthConfig(prompts=4, group_size=2, epochs=2, mean_len=6, vocab=60, seed=1))
    argv = ["bench", "pipe-servers", "--model", str(model), "--trace", str(trace), "--steps", "2", "--json"]
    assert main([*argv, *overlap, "--policies", "round-robin,histopipe", "--max-running", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["policy"] for r in out["results"]] == ["round-robin", "histopipe"]
    for r in out["results"]:
        assert r["makespan"] > 0 and r["simulated"]["makespan"] > 0 and 0 <= r["idle_fraction"] < 1
