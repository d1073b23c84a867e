"""The draft selector (engine/selector.py) and the draft-size policy (engine/policy.py): packing drafts, budgets, the
cost cut, pauses and what the policy learns."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from sglang_histospec.drafting import ROOT, Draft
from sglang_histospec.drafting.draft_cut import StepCostModel
from sglang_histospec.drafting.flat import FlatDrafts
from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams
from sglang_histospec.engine.governor import GovernorConfig
from sglang_histospec.engine.policy import DraftSizePolicy
from sglang_histospec.engine.scheduler import Scheduler
from sglang_histospec.engine.selector import DraftSelector, _tree_nodes, pack_draft, pack_flat
from sglang_histospec.engine.treebatch import WalkResult
from sglang_histospec.engine.types import DraftPolicyConfig
from tests.helpers.engine_tools import FixedBudgets, ScriptedDrafter

D = Draft([5, 7, 6], [ROOT, ROOT, 0], [0.9, 0.5, 0.2])  # root -> 5 -> 6, root -> 7

PACK_CASES = [  # (budget, vocab_size, min_score, tokens, parents, kept)
    (4, 64, 0.0, [0, 5, 7, 6], [-1, 0, 0, 1], [0, 1, 2]),  # everything fits
    (2, 64, 0.0, [0, 5, 7], [-1, 0, 0], [0, 1]),  # the budget
    (4, 64, 0.4, [0, 5, 7], [-1, 0, 0], [0, 1]),  # the score (the module docstring's example)
    (4, 7, 0.0, [0, 5, 6], [-1, 0, 1], [0, 2]),  # 7 is outside the vocabulary
    (4, 64, 0.95, [0], [-1], []),  # nothing clears the score
]


@pytest.mark.parametrize("budget, vocab, min_score, tokens, parents, kept", PACK_CASES)
def test_pack_draft(budget, vocab, min_score, tokens, parents, kept):
    assert pack_draft(D, budget, vocab, min_score) == (tokens, parents, kept)


def test_pack_draft_drops_children_of_dropped_nodes():
    assert pack_draft(D, 4, 64, 0.5, scores=[0.1, 0.9, 0.9]) == ([0, 7], [-1, 0], [1])  # 6's parent 5 is cut


@hst.composite
def _drafts_and_keeps(draw):
    """Drafts (parents before children, tokens partly outside a vocabulary of 8), limits and keep flags."""
    drafts, limits, keeps = [], [], []
    for _ in range(draw(hst.integers(0, 5))):
        n = draw(hst.integers(0, 7))
        parents = [draw(hst.integers(-1, i - 1)) for i in range(n)]
        tokens = draw(hst.lists(hst.integers(-1, 9), min_size=n, max_size=n))
        drafts.append(Draft(tokens, parents, [1.0] * n))
        limits.append(draw(hst.integers(0, 8)))
        keeps.append(draw(hst.lists(hst.booleans(), min_size=n, max_size=n)))
    return drafts, limits, keeps


@settings(max_examples=300, deadline=None)
@given(_drafts_and_keeps())
def test_pack_flat_matches_pack_draft_per_draft(case):
    """The whole-step packing equals the per-draft reference (scores 1.0 / 0.0, min_score 0.5), trees included."""
    drafts, limits, keeps = case
    flat = FlatDrafts.of(drafts, limits)
    assert flat.check() is None
    keep = np.array([k for ks, n in zip(keeps, flat.sizes.tolist()) for k in ks[:n]], dtype=bool)
    kept = pack_flat(flat, keep, vocab_size=8)
    ask = [2 * i for i in range(len(drafts))]  # draft i belongs to request 2i
    nodes, owner, parents = _tree_nodes(flat, kept, ask)
    for i, (d, limit, ks) in enumerate(zip(drafts, limits, keeps)):
        tokens, pars, want = pack_draft(d, limit, 8, 0.5, scores=[float(k) for k in ks])
        mine = nodes[flat.owner[nodes] == i]
        assert (mine - flat.starts[i]).tolist() == want
        assert flat.tokens[mine].tolist() == tokens[1:] and parents[owner == ask[i]].tolist() == pars[1:]


def _selector(drafter, budgets=None, max_context_len=64, **cfg):
    # the policy's own rules: no explore budget (it holds drafting until plain steps were timed; test_governor.py)
    config = EngineConfig(
        model_path="unused", policy=DraftPolicyConfig(governor=GovernorConfig(explore_budget=math.inf)), **cfg
    )
    policy = DraftSizePolicy(config, drafter, max_context_len, budgets or FixedBudgets(4))
    return DraftSelector(policy, drafter, 64)


def _running(n=2, max_new=8, prompt=(1, 5, 6)):
    s = Scheduler(max_running=n, seed=0, eos_ids=frozenset())
    for i in range(n):
        s.add(
            GenerateRequest(
                rid=f"r{i}", input_ids=list(prompt), prompt_id=f"p{i}", sampling=SamplingParams(max_new_tokens=max_new)
            )
        )
    return s.admit()


def test_step_budgets_are_capped():
    running = _running(3, max_new=8)
    running[1].output = [9] * 6  # 1 token left after the root's: at most 1 draft node
    running[2].tokens = running[2].tokens + [9] * 59  # 2 tokens of context room left
    sel = _selector(ScriptedDrafter({}), FixedBudgets(20), num_draft_tokens=5, draft_selection="always")
    assert sel.policy.step_budgets(running) == [5, 1, 2]
    plain = _selector(ScriptedDrafter({}), speculative_algorithm="NONE")
    assert not plain.policy.speculate and plain.policy.step_budgets(running) == [0, 0, 0]


def test_select_packs_trees_and_learns_what_was_accepted():
    """Request r0 has a reference continuation (a chain of 4 within its budget), r1 none (its root alone)."""
    drafter = ScriptedDrafter({"p0": [7, 8, 9, 10, 11]})
    sel = _selector(drafter, draft_selection="always")
    running = _running(2)
    for st in running:
        drafter.start(st.req.rid, st.req.prompt_id, st.tokens)
    got = sel.select(running, prefill=4, started=0.0)
    assert got.drafted and got.nodes.tolist() == [0, 1, 2, 3]  # r0's four nodes; r1 drafted nothing
    assert got.tb.counts.tolist() == [5, 1] and got.tb.tokens.tolist() == [6, 7, 8, 9, 10, 6]
    before = sel.policy.calibration.table()
    sel.policy.observe(got, [WalkResult([1, 2], [7, 8, 3], [0, 1, 2]), WalkResult([], [4], [5])], 2, 4, 4, 0.0)
    assert sel.policy.calibration.table() != before  # 2 of the 4 verified nodes accepted
    assert sel.policy.step_cost.ready is False  # one real step: far from min_steps


def _expensive_rows() -> StepCostModel:
    model = StepCostModel()
    for extra in (0, 10) * 16:  # 50 ms a step, 1 s per extra row: no draft node pays
        model.observe(1, 1 + extra, 0.05 + 1.0 * extra)
    model.observe = lambda *a, **k: None  # keep these costs
    return model


def test_cut_pauses_drafting_when_nothing_pays():
    """Drafting that cannot pay still verifies its best node; once drafting is measured to cost host time, such a
    step pauses drafting for 1 step, then 2, 4, ... (doubling)."""
    drafter = ScriptedDrafter({"p0": [7, 8, 9, 10, 11]})
    sel = _selector(drafter, draft_selection="adaptive")
    sel.policy.step_cost = _expensive_rows()
    sel.policy.governor = None
    [st] = _running(1)
    drafter.start(st.req.rid, st.req.prompt_id, st.tokens)
    pattern = []
    for _ in range(8):
        started = time.perf_counter() - 0.01  # 10 ms of drafting work
        got = sel.select([st], prefill=0, started=started)
        pattern.append(got.tb.num_rows - 1)
        sel.policy.observe(got, [WalkResult([], [3], [0])], 1, 0, 1, started)
    # no drafting time measured yet at the first cut; then 1 node and a pause of 1, of 2, of 4 steps
    assert pattern == [1, 1, 0, 1, 0, 0, 1, 0]
    assert sel.policy.counts == {"draft_pauses": 3, "paused_steps": 4}


def _cheap_rows() -> StepCostModel:
    model = StepCostModel()
    for extra in (0, 10) * 16:  # 102.5 ms a step, 1 ms per extra row: every likely node pays
        model.observe(1, 1 + extra, 0.1025 + 0.001 * extra)
    model.observe = lambda *a, **k: None
    return model


@pytest.mark.parametrize("trusted, ramp, rows", [(False, 1.0, 25), (True, 1.0, 25), (False, 4.0, 25), (True, 2.0, 40)])
def test_a_probe_of_drafting_verifies_only_its_best_nodes(trusted, ramp, rows):
    """Until the governor measured drafting to win, a step keeps at most probe_cost x its cost in rows: 0.25 x
    102.5 ms / 1 ms = 25.6, so 25 of the 40 nodes that pay; once trusted, that cap times the ramp (51 at 2)."""
    drafter = ScriptedDrafter({"p0": list(range(10, 50))})
    scripted = drafter.draft
    drafter.draft = lambda rid, b: dataclasses.replace(scripted(rid, b), source="anchors")  # probabilities as drafted
    sel = _selector(drafter, FixedBudgets(40), num_draft_tokens=40, draft_selection="adaptive")
    sel.policy.step_cost = _cheap_rows()
    sel.policy.governor.trusts_spec = lambda bsz: trusted
    sel.policy._ramp = ramp
    [st] = _running(1, max_new=64)
    drafter.start(st.req.rid, st.req.prompt_id, st.tokens)
    got = sel.select([st], prefill=0, started=time.perf_counter())
    assert got.tb.num_rows - 1 == rows


def _cut_step(sel, st, accepted: int):
    """One selected step of request ``st`` whose first ``accepted`` tree nodes the target accepted."""
    got = sel.select([st], prefill=0, started=time.perf_counter())
    walk = WalkResult(list(range(1, accepted + 1)), [3] * (accepted + 1), [0] * (accepted + 1))
    sel.policy.observe(got, [walk], 1, 0, accepted + 1, time.perf_counter())
    return got


@pytest.mark.parametrize(
    "accepted, ramp, scale",
    [
        (25, 2.0, 1.0),  # every probed node accepted: they paid, the ramp doubles, the scale stays at 1
        (1, 2.0, 5 / 29),  # one token saves a 102.5 ms step for 25 rows at 1 ms: paid; the scale falls
        (0, 1.0, 4 / 29),  # none accepted: the ramp stays at its floor
    ],
)
def test_ramp_and_acceptance_scale_follow_what_was_accepted(accepted, ramp, scale):
    """A step keeps 25 nodes drafted at probability 1 (the probe cap): its accepted count moves the ramp and the
    acceptance scale (decayed sums from 4 predicted nodes of ratio 1)."""
    drafter = ScriptedDrafter({"p0": list(range(10, 50))})
    scripted = drafter.draft
    drafter.draft = lambda rid, b: dataclasses.replace(scripted(rid, b), source="anchors")
    sel = _selector(drafter, FixedBudgets(40), num_draft_tokens=40, draft_selection="adaptive")
    sel.policy.step_cost = _cheap_rows()
    [st] = _running(1, max_new=64)
    drafter.start(st.req.rid, st.req.prompt_id, st.tokens)
    got = _cut_step(sel, st, accepted)
    assert got.tb.num_rows - 1 == 25 and got.predicted == pytest.approx(25.0)
    assert sel.policy._ramp == ramp
    assert sel.policy.acceptance_scale() == pytest.approx(scale)


def test_new_history_step_resets_ramp_and_scale():
    drafter = ScriptedDrafter({"p0": [7, 8]})
    drafter.open_step = 0
    sel = _selector(drafter, draft_selection="adaptive")
    sel.policy.step_budgets(_running(1))
    sel.policy._ramp, sel.policy._scale = 8.0, [1.0, 9.0]
    drafter.open_step = 1
    sel.policy.step_budgets(_running(1))
    assert sel.policy._ramp == 1.0 and sel.policy.acceptance_scale() == 1.0


def test_new_history_step_ends_a_pause():
    drafter = ScriptedDrafter({"p0": [7, 8]})
    drafter.open_step = 0
    sel = _selector(drafter, draft_selection="adaptive")
    sel.policy._pause = 3
    running = _running(1)
    assert sel.policy.step_budgets(running) == [0]
    drafter.open_step = 1  # the drafter moved on: whether drafting pays is measured anew
    assert sel.policy.step_budgets(running) == [4]


def test_a_drafting_step_tells_the_drafter_only_about_the_requests_it_drafts_for():
    """The drafter hears a request's new tokens when a step drafts for it: a step that drafts for one request of a
    batch pays for that one's tokens, not for what every request emitted since the last drafting step."""
    drafter = ScriptedDrafter({"p0": [7, 8, 9]})
    heard = []
    drafter.extend = lambda rid, toks: heard.append((rid, list(toks)))
    sel = _selector(drafter, FixedBudgets(4), draft_selection="always")
    running = _running(3, max_new=8)
    for st in running:
        drafter.start(st.req.rid, st.req.prompt_id, st.tokens)
        st.output = [9] * 3
    running[1].output = [9] * 7  # no token left to draft for: budget 0
    running[2].output = [9] * 7
    sel.select(running, prefill=0, started=time.perf_counter())
    assert heard == [("r0", [9, 9, 9])]
    assert [st.told for st in running] == [3, 0, 0]  # the others are told when they next draft (or finish)


def test_always_drafts_every_node_whatever_the_step_times():
    """draft_selection="always": no governor, no cut, no pause; rows priced far above a step's tokens change nothing,
    so a repeated greedy request is drafted alike in every run."""
    drafter = ScriptedDrafter({"p0": [7, 8, 9, 10, 11]})
    sel = _selector(drafter, draft_selection="always")
    sel.policy.step_cost = _expensive_rows()
    assert sel.policy.governor is None and not sel.policy.cut_on
    [st] = _running(1)
    drafter.start(st.req.rid, st.req.prompt_id, st.tokens)
    for _ in range(4):
        started = time.perf_counter() - 0.01
        got = sel.select([st], prefill=0, started=started)
        assert got.tb.num_rows - 1 == 4  # the whole budget
        sel.policy.observe(got, [WalkResult([], [3], [0])], 1, 0, 1, started)
    assert sel.policy.counts == {}
