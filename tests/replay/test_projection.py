"""The rollout-time projection of a lockstep replay (replay/projection.py) and the adaptive cut on a table."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_histospec.drafting.drafter import DrafterConfig
from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.drafting.verify_cost import VerifyCostTable
from sglang_histospec.replay.drafters.histospec import HistoSpecReplayDrafter
from sglang_histospec.replay.projection import (
    ProjectionConfig,
    TableCut,
    plain_batches,
    project,
    project_rounds,
    trim,
)
from sglang_histospec.replay.simulator import BaseDrafter, ReplayConfig, admission_order, replay
from sglang_histospec.trace.format import TraceRecord, TraceStep, load_steps, write_trace
from sglang_histospec.trace.synth import SynthConfig, generate


class NextTokens(BaseDrafter):
    """Drafts the next ``depth`` recorded tokens of every request (a chain): every node is accepted."""

    name = "next-tokens"

    def __init__(self, responses: dict[str, list[int]], depth: int) -> None:
        self.responses, self.depth, self.pos = responses, depth, {}

    def start(self, req_id, prompt_id, prompt):
        self.pos[req_id] = (prompt_id, 0)

    def extend(self, req_id, tokens):
        pid, p = self.pos[req_id]
        self.pos[req_id] = (pid, p + len(tokens))

    def draft(self, req_id, budget):
        pid, p = self.pos[req_id]
        toks = self.responses[pid][p : p + min(self.depth, budget)]
        return Draft(toks, [ROOT, *range(len(toks) - 1)], [1.0] * len(toks), match_len=1, source="self")


def table(fn, batches=(1, 2, 4, 8, 16, 32, 64), ks=(1, 2, 4, 8, 16, 32)) -> VerifyCostTable:
    return VerifyCostTable.from_ms({b: (list(ks), [fn(k, b) for k in ks]) for b in batches}, "test")


def zero_host(rounds):
    return [(s, b, rows, 0) for s, b, rows, _ in rounds]


def two_requests():
    recs = [TraceRecord(0, "a", 0, [9], [1, 2, 3, 4]), TraceRecord(0, "b", 0, [9], [5, 6])]
    return [TraceStep(0, recs)], {"a": [1, 2, 3, 4], "b": []}


def test_hand_computed_step_of_two_requests():
    """a drafts its next 2 tokens (all accepted), b nothing: round 0 runs 2 requests with 3 + 1 rows, round 1 with
    2 + 1 (a has one token left: one node) and finishes both. Pass time = batch x rows per request = the rows;
    plain: batches 2, 2, 1, 1."""
    steps, responses = two_requests()
    res = replay(steps, NextTokens(responses, 2), ReplayConfig(budget=2, oracle=False, record_rounds=True))
    assert [(b, rows) for _, b, rows, _ in res.rounds] == [(2, 4), (2, 3)]
    p = project_rounds(zero_host(res.rounds), [4, 2], None, ProjectionConfig(table(lambda k, b: b * k)))
    assert (p.pass_ms, p.plain_ms, p.rounds, p.plain_rounds) == pytest.approx((7.0, 6.0, 2, 4))
    assert p.speedup == pytest.approx(6 / 7)
    assert p.to_json()["plain_tail_share"] == 0.0  # tail: fewer than 0.25 x 2 requests running: never


def test_host_time_is_added_over_host_speed():
    rounds = [(0, 2, 4, 3_000_000), (0, 2, 3, 1_000_000)]
    cfg = ProjectionConfig(table(lambda k, b: b * k), host_speed=2.0)
    p = project_rounds(rounds, [4, 2], None, cfg)
    assert p.host_ms == pytest.approx(2.0) and p.ms == pytest.approx(9.0)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("projection") / "synth.jsonl.gz"
    write_trace(path, generate(SynthConfig(prompts=3, group_size=4, epochs=3, mean_len=40, vocab=500, seed=1)))
    return load_steps(path)[0]


@pytest.mark.parametrize("width", [None, 3])
def test_unit_costs_and_no_host_time_give_the_number_of_rounds(width, synth):
    steps = synth
    drafter = HistoSpecReplayDrafter(DrafterConfig())
    cfg = ReplayConfig(budget=8, oracle=False, record_rounds=True, batch_drafts=True, max_running=width)
    res = replay(steps, drafter, cfg)
    lengths = {st.step: [len(r.response) for r in admission_order(st.records, "lockstep")] for st in steps}
    total, per_step = project(zero_host(res.rounds), lengths, width, ProjectionConfig(table(lambda k, b: 1.0)))
    assert total.ms == len(res.rounds) == total.rounds
    assert total.plain_ms == sum(len(plain_batches(v, width)) for v in lengths.values())
    assert sum(p.rounds for p in per_step.values()) == total.rounds
    assert res.tau > 1.0  # it drafted: fewer rounds than plain
    assert total.ms < total.plain_ms


@pytest.mark.parametrize(
    ("lengths", "width", "want"),
    [
        ([3, 1, 2], None, [3, 2, 1]),
        ([3, 1, 2], 2, [2, 2, 2]),
        ([1, 1, 1], 2, [2, 1]),
        ([0, 2], 1, [1, 1]),
        ([], None, []),
        ([2], 5, [1, 1]),
    ],
)
def test_plain_batches(lengths, width, want):
    assert plain_batches(lengths, width).tolist() == want


def test_doubling_row_cost_never_drafts_and_never_loses(synth):
    steps = synth
    drafter = HistoSpecReplayDrafter(DrafterConfig())
    doubling = table(lambda k, b: b * 2.0 ** (k - 1))
    cut = TableCut(doubling, drafter.drafter.calibration, budget=8)
    cfg = ReplayConfig(budget=8, oracle=False, record_rounds=True, batch_drafts=True, cut=cut)
    res = replay(steps, drafter, cfg)
    lengths = {st.step: [len(r.response) for r in admission_order(st.records, "lockstep")] for st in steps}
    total, _ = project(res.rounds, lengths, None, ProjectionConfig(doubling))
    assert res.drafted == 0 and cut.counts["drafted"] == 0 and cut.counts["never_pays"] == total.rounds
    assert total.pass_ms == pytest.approx(total.plain_ms)  # the verify passes are plain ones
    assert total.ms == pytest.approx(total.plain_ms + total.host_ms)  # only the extends' bookkeeping remains


def test_adaptive_cut_on_a_cheap_table_keeps_drafting_and_gains(synth):
    steps = synth
    cheap = table(lambda k, b: 1.0 + 0.01 * (k - 1) * b)
    drafter = HistoSpecReplayDrafter(DrafterConfig())
    cut = TableCut(cheap, drafter.drafter.calibration, budget=8)
    cfg = ReplayConfig(budget=8, oracle=False, record_rounds=True, batch_drafts=True, cut=cut)
    res = replay(steps, drafter, cfg)
    lengths = {st.step: [len(r.response) for r in admission_order(st.records, "lockstep")] for st in steps}
    total, _ = project(zero_host(res.rounds), lengths, None, ProjectionConfig(cheap))
    assert cut.counts["drafted"] > 0 and res.drafted > 0 and total.speedup > 1.0


def test_trim_keeps_whole_paths():
    d = Draft([5, 7, 6, 8], [ROOT, ROOT, 0, 1], [0.6, 0.4, 0.5, 0.3], match_len=2, source="anchors")
    t = trim(d, np.array([True, False, True, True]))  # 8's parent 7 is dropped: 8 goes too
    assert (t.token_ids, t.parents, t.probs, t.match_len) == ([5, 6], [ROOT, 0], [0.6, 0.5], 2)
    assert trim(d, np.zeros(4, dtype=bool)) == Draft.empty()
    assert trim(d, np.ones(4, dtype=bool)) is d


def test_projection_refuses_a_relative_table_and_a_bad_host_speed():
    with pytest.raises(ValueError, match="absolute pass times"):
        ProjectionConfig(VerifyCostTable.from_dict({"batches": {"1": {"1": 1.0}}}))
    with pytest.raises(ValueError, match="host-speed"):
        ProjectionConfig(VerifyCostTable.default(), host_speed=0)


@pytest.mark.parametrize("width", [None, 1, 2, 5])
def test_plain_batches_are_the_rounds_of_a_replay_that_never_drafts(width, synth):
    from sglang_histospec.replay.simulator import NoneDrafter

    res = replay(synth, NoneDrafter(), ReplayConfig(budget=4, oracle=False, record_rounds=True, max_running=width))
    for st in synth:
        lengths = [len(r.response) for r in admission_order(st.records, "lockstep")]
        assert [b for s, b, _, _ in res.rounds if s == st.step] == plain_batches(lengths, width).tolist()
