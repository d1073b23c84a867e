"""SpecGovernor: drafting only while it is measured to pay, with probes of the losing mode (fake timings)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.engine.governor import (
    PROBE_HOST_S,
    PROBE_ROOM_MAX,
    GovernorConfig,
    SpecGovernor,
    critical_progress,
)

UNBUDGETED = GovernorConfig(explore_budget=math.inf)
"""For tests of the buckets' rules apart from the explore budget (tested below)."""


def run(g: SpecGovernor, steps: int, bsz: int, spec_rate: float, plain_rate: float) -> list[bool]:
    """Drive ``steps`` decisions; a drafting step runs at ``spec_rate`` tokens/s, a plain one at ``plain_rate``."""
    used = []
    for _ in range(steps):
        spec = g.use_spec(bsz)
        g.observe(bsz, spec, tokens=bsz, seconds=bsz / (spec_rate if spec else plain_rate))
        used.append(spec)
    return used


@pytest.mark.parametrize(
    "spec_rate, plain_rate, min_share, max_share",
    [
        (200.0, 100.0, 0.9, 0.97),  # drafting pays: draft, with a plain probe every 16 steps
        (50.0, 100.0, 0.0, 0.08),  # drafting loses: plain, with rarer and rarer drafting probes
        (100.0, 100.0, 0.9, 0.97),  # a tie drafts (never slower than plain by construction)
    ],
)
def test_share_of_drafting_steps_follows_the_measured_rates(spec_rate, plain_rate, min_share, max_share):
    used = run(SpecGovernor(), 600, 16, spec_rate, plain_rate)
    share = sum(used[100:]) / len(used[100:])
    assert min_share <= share <= max_share


def test_losing_drafting_costs_little_and_recovers_when_it_starts_to_pay():
    g = SpecGovernor()
    slow = run(g, 400, 8, spec_rate=50.0, plain_rate=100.0)
    fast = run(g, 400, 8, spec_rate=300.0, plain_rate=100.0)
    tokens_per_s = [(300.0 if s else 100.0) for s in fast[200:]]
    assert sum(slow[-200:]) <= 4  # probes only
    assert sum(tokens_per_s) / len(tokens_per_s) > 250.0  # back to drafting within the probe interval


def test_buckets_by_batch_size_are_independent():
    g = SpecGovernor()
    run(g, 200, 2, spec_rate=300.0, plain_rate=100.0)  # bucket 2: drafting pays
    run(g, 200, 32, spec_rate=50.0, plain_rate=100.0)  # bucket 6: it does not
    assert sum(run(g, 32, 3, 300.0, 100.0)) >= 28 and sum(run(g, 32, 40, 50.0, 100.0)) <= 2
    assert set(g.rates()) == {2, 6}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_samples": 0}, "min_samples"),
        ({"decay": 1.0}, "decay"),
        ({"max_probe_interval": 4}, "max_probe"),
        ({"wall_cap": -0.1}, "wall_cap"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GovernorConfig(**kwargs)


def test_a_drafting_probe_that_drafted_nothing_is_repeated():
    g = SpecGovernor()
    run(g, 100, 4, spec_rate=50.0, plain_rate=100.0)  # plain wins
    while not g.use_spec(4):  # wait for the next probe of drafting
        g.observe(4, False, 4, 0.04)
    g.observe(4, False, 4, 0.04)  # ... but the step drafted nothing (e.g. no history matched)
    assert g.use_spec(4)  # so the probe comes again at once


def test_new_history_makes_drafting_be_measured_again():
    g = SpecGovernor(UNBUDGETED)  # the buckets' rules alone
    run(g, 200, 4, spec_rate=50.0, plain_rate=100.0)  # no history yet: plain wins
    g.forget_drafting()  # the drafter closed a step
    assert g.use_spec(4)  # drafting is measured again at once
    g.observe(4, True, 4, 4 / 50.0)  # ... and still loses: plain again, without min_samples more drafting steps
    assert not g.use_spec(4)
    g.forget_drafting()
    assert g.use_spec(4)
    for _ in range(3):  # a drafting step that now pays wins the bucket back within a few steps
        g.observe(4, True, 4, 4 / 400.0)
    assert g.use_spec(4)


@pytest.mark.parametrize("factor", [0.7, 0.9])
def test_a_drifting_plain_rate_does_not_read_as_a_drafting_win(factor):
    """Step times grow within an epoch: the plain rate falls from 200 to 100 tokens/s while a drafting step always
    runs at ``factor`` x the plain rate of its moment. Drafting must stay at probe level, not win back by comparing
    the fresh plain mean with the stale drafting one."""
    g, used = SpecGovernor(), []
    for i in range(400):
        plain = 200.0 - 100.0 * i / 400
        spec = g.use_spec(16)
        g.observe(16, spec, tokens=16, seconds=16 / (factor * plain if spec else plain))
        used.append(spec)
    assert sum(used[40:]) <= 10


def test_drafting_is_trusted_only_once_measured_to_win():
    g = SpecGovernor()
    assert not g.trusts_spec(16)  # nothing measured
    run(g, 40, 16, spec_rate=200.0, plain_rate=100.0)
    assert g.trusts_spec(16) and not g.trusts_spec(4)  # per bucket
    g.forget_drafting()
    assert not g.trusts_spec(16)  # a new history: measured anew
    run(g, 40, 16, spec_rate=50.0, plain_rate=100.0)
    assert not g.trusts_spec(16)


@pytest.mark.parametrize("trusted_weight, first_plain", [(0.25, range(1, 5)), (0.0, range(5, 17))])
def test_trusted_drafting_that_stops_paying_loses_the_trust_within_a_few_steps(trusted_weight, first_plain):
    """Drafting won (2x); then it runs at 0.7x plain: each trusted drafting step is re-checked against the plain
    mean, so the governor falls back to plain decoding before its next plain probe (every 16 steps)."""
    g = SpecGovernor(GovernorConfig(trusted_weight=trusted_weight, explore_budget=math.inf))  # the buckets' rules
    run(g, 200, 8, spec_rate=200.0, plain_rate=100.0)
    assert g.trusts_spec(8)
    losing = run(g, 40, 8, spec_rate=70.0, plain_rate=100.0)
    assert losing.index(False) in first_plain


def test_trust_withdrawn_by_rechecks_returns_with_the_first_winning_probe():
    """Re-checks withdraw the trust just below parity; the next drafting probe that measures a win restores it."""
    g = SpecGovernor(UNBUDGETED)  # the buckets' rules alone
    run(g, 200, 8, spec_rate=200.0, plain_rate=100.0)
    run(g, 10, 8, spec_rate=70.0, plain_rate=100.0)
    assert not g.trusts_spec(8)
    again = run(g, 40, 8, spec_rate=120.0, plain_rate=100.0)
    assert g.trusts_spec(8) and sum(again[-8:]) >= 7


def test_plain_rate_is_the_bucket_mean_of_plain_steps():
    g = SpecGovernor()
    assert g.plain_rate(8) is None
    g.observe(8, drafted=False, tokens=8, seconds=0.1)
    assert g.plain_rate(9) == pytest.approx(80.0) and g.plain_rate(16) is None


@pytest.mark.parametrize("slowdown", [0.95, 0.6, 0.1])
@pytest.mark.parametrize("bsz", [1, 16, 64])
def test_losing_drafting_costs_at_most_the_explore_budget(slowdown, bsz):
    """Whatever the buckets decide, drafting steps that lose cost at most ``explore_budget`` of the decode time
    (plus the one step that crosses it) over decoding every token plainly."""
    g = SpecGovernor()
    plain_step = 0.002 + 1e-5 * bsz
    spent = tokens = 0.0
    for _ in range(3000):
        spec = g.use_spec(bsz)
        seconds = plain_step / slowdown if spec else plain_step
        g.observe(bsz, spec, tokens=bsz, seconds=seconds)
        spent, tokens = spent + seconds, tokens + bsz
    plain_time = tokens / bsz * plain_step
    assert spent <= (1.0 + g.cfg.explore_budget) * plain_time + plain_step / slowdown
    assert g.stats["budget_plain_steps"] > 0


@pytest.mark.parametrize("slowdown", [0.6, 0.1])
@pytest.mark.parametrize("step_len", [50, 400])
def test_losing_drafting_over_history_steps_costs_at_most_the_budget_of_one_more_step(slowdown, step_len):
    """With ``history_probe`` each history step's budget is sized by the longer of its own decode time and the last
    one's: over many steps of ``step_len`` decode steps, losing drafting costs at most ``explore_budget`` of the
    decode time plus that of one more step (plus one crossing step per history step)."""
    g = SpecGovernor()
    plain_step, steps = 0.002, 12
    spent = 0.0
    for _ in range(steps):
        g.forget_drafting()
        for _ in range(step_len):
            spec = g.use_spec(4)
            seconds = plain_step / slowdown if spec else plain_step
            g.observe(4, spec, tokens=4, seconds=seconds)
            spent += seconds
    plain_time = steps * step_len * plain_step
    bound = (1.0 + g.cfg.explore_budget) * plain_time + g.cfg.explore_budget * step_len * plain_step
    assert spent <= bound + steps * plain_step / slowdown


@pytest.mark.parametrize("history_probe", [False, True])
def test_the_explore_budget_starts_again_at_each_history_step(history_probe):
    g = SpecGovernor(GovernorConfig(history_probe=history_probe))
    run(g, 8, 4, spec_rate=100.0, plain_rate=100.0)  # plain steps first: the fit the budget is measured against
    assert g.within_budget()
    g.observe(4, True, tokens=4, seconds=10.0)  # one drafting step far slower than plain
    assert not g.within_budget() and not g.use_spec(4)
    g.forget_drafting()  # a new history step: a fresh window
    assert g.within_budget()
    # that probe cost 249 plain steps more than plain decoding: the next waits for room for PROBE_ROOM_MAX of them,
    # 0.16 s at 1 % of the decode time, 0.4 ms a step (the last step's 10.32 s give 0.103 s: not enough)
    assert not g.within_budget(4)
    assert waits_for_a_probe(g, 4, 0.04) in (400, 401)


@pytest.mark.parametrize("history_probe, drafts", [(True, True), (False, False)])
def test_a_new_historys_first_drafting_step_replaces_the_last_historys_mean(history_probe, drafts):
    """Drafting lost by half on the last history; on the new one a first drafting step 10 % faster than plain steps
    decides alone (averaged with the old mean, 0.5 * 50 + 0.5 * 110 < 100, it would lose)."""
    g = SpecGovernor(GovernorConfig(history_probe=history_probe, explore_budget=math.inf))
    run(g, 64, 4, spec_rate=50.0, plain_rate=100.0)
    g.forget_drafting()
    assert g.use_spec(4)  # the fresh probe
    g.observe(4, True, tokens=4, seconds=4 / 110.0)
    assert g.use_spec(4) == drafts and g.trusts_spec(4) == drafts


@pytest.mark.parametrize(
    "history_probe, last_steps, at_once",
    [
        (True, 400, True),  # the last step's 16 s give 0.16 s of room: enough for a probe (11.2 ms) at once
        (True, 8, False),  # its 0.32 s give 3.2 ms: the probe waits, as it would within the new step alone
        (False, 400, False),  # the budget of the new step alone
    ],
)
def test_a_new_history_steps_budget_is_sized_by_the_last_ones_decode_time(history_probe, last_steps, at_once):
    """With ``history_probe`` the explore budget of a new history step starts from the decode time of the last one,
    so a probe runs at once where that budget covers its cost, and only there: a short step (a small model's
    epoch) keeps decoding plainly. Before any history step the budget rules alone."""
    g = SpecGovernor(GovernorConfig(history_probe=history_probe))
    for _ in range(last_steps):
        g.observe(4, False, tokens=4, seconds=0.04)
    if last_steps == 400:
        assert g.use_spec(4)  # the step's own room: a probe (then measured to cost a plain step more)
        g.observe(4, True, tokens=4, seconds=0.08)
    g.forget_drafting()
    assert g.use_spec(4) == at_once
    if at_once:  # the room is spent by probes that lose: 0.16 s of room, 0.04 s each
        for _ in range(4):
            g.observe(4, True, tokens=4, seconds=0.08)
        assert not g.within_budget(4)


def waits_for_a_probe(g: SpecGovernor, bsz: int, plain_s: float) -> int:
    """Plain steps of ``plain_s`` seconds until the governor lets a step of ``bsz`` requests draft."""
    waited = 0
    while not g.use_spec(bsz):
        g.observe(bsz, False, tokens=bsz, seconds=plain_s)
        waited += 1
    return waited


def first_probe_room(bsz: int, plain_s: float, probe_cost: float = 0.25) -> float:
    """Seconds of room the first probe of a governor waits for: the capped rows and the expected host work."""
    fixed, per_request = PROBE_HOST_S
    return min(probe_cost * plain_s + fixed + per_request * bsz, PROBE_ROOM_MAX * plain_s)


def test_a_probe_waits_for_room_for_what_probes_were_measured_to_cost():
    """The room a probe of drafting waits for is the excess its bucket's drafting steps were measured to cost before
    they won (host work included); a bucket without a measurement takes the last one measured elsewhere, in plain
    steps, or, before any, the capped rows and the expected host work."""
    g = SpecGovernor(GovernorConfig(explore_budget=0.02, history_probe=False))
    assert waits_for_a_probe(g, 4, 0.04) == math.ceil(first_probe_room(4, 0.04) / (0.02 * 0.04))
    g.observe(4, True, tokens=4, seconds=0.04 * 3)  # the probe took three plain steps' time: two more
    g.forget_drafting()
    assert waits_for_a_probe(g, 4, 0.04) in (100, 101)  # room for 2 plain steps at 0.02 of the decode time
    g.forget_drafting()
    # a new bucket: the last measured excess, 2 plain steps as the fit prices them at 16 (from its steps at 4 at first)
    assert 100 <= waits_for_a_probe(g, 16, 0.04) <= 125
    for bsz, plain_s in [(4, 0.04), (64, 0.004), (1, 0.0005)]:  # the last: the cap, 4 plain steps
        expected = math.ceil(first_probe_room(bsz, plain_s) / (0.01 * plain_s))
        assert waits_for_a_probe(SpecGovernor(), bsz, plain_s) in (expected, expected + 1)


def test_a_probe_waits_for_what_its_own_buckets_probe_cost_in_seconds():
    """Plain steps of 64 requests dominate the plain fit; a probe at 6 requests (an epoch's tail) that cost 2.5 ms more
    than its 9 tokens would have plainly: the next probe there waits for 2.5 ms of room, whatever the fit says."""
    g = SpecGovernor(GovernorConfig(history_probe=False))
    for _ in range(200):
        g.observe(64, False, tokens=64, seconds=0.003)
    for _ in range(8):
        g.observe(6, False, tokens=6, seconds=0.001)
    g.observe(6, True, tokens=9, seconds=0.004)  # a probe at the tail: 3 ms more than plain
    g.forget_drafting()
    assert 0.9 * 250 <= waits_for_a_probe(g, 6, 0.001) <= 1.1 * 250  # 2.5 ms at 1 % of 1-ms steps


def test_without_a_budget_drafting_may_start_before_plain_steps_were_measured():
    assert SpecGovernor(GovernorConfig(explore_budget=math.inf)).use_spec(4)
    assert not SpecGovernor().use_spec(4)  # the default measures plain steps first


@pytest.mark.parametrize(
    "rooms, emitted, progress",
    [
        ([96], [4], 4),  # one request: all it got
        ([96, 96], [4, 1], 1),  # two at the cap: the one that got 1 still bounds the end
        ([96, 96], [4, 3], 3),
        ([90, 96], [5, 2], 2),  # the one with the most room bounds it
        ([95, 96], [1, 3], 2),  # ... until the other one, with less room, does: 96 - 94
        ([3, 2], [5, 5], 3),  # tokens past a request's room end it
    ],
)
def test_critical_progress_is_how_far_the_caps_bound_on_the_end_moved(rooms, emitted, progress):
    assert critical_progress(rooms, emitted) == progress


def fitted(a: float, b: float, cfg: GovernorConfig | None = None) -> SpecGovernor:
    """A governor whose plain fit is ``a + b * bsz`` seconds a step (plain steps of 4 and 16 requests)."""
    g = SpecGovernor(cfg)
    for _ in range(8):
        for bsz in (4, 16):
            g.observe(bsz, False, tokens=bsz, seconds=a + b * bsz)
    g.within_budget()  # folds the queued steps in
    return g


def test_a_drain_credits_tokens_off_the_end_with_a_step_and_the_rest_with_a_row():
    g = fitted(0.06, 0.003)
    assert g.credit(16, 17, None) == 17  # requests wait: a slot freed early is filled
    assert g.credit(16, 17, 1) == pytest.approx(16 * (0.06 + 0.003 * 17) / 0.108)
    assert g.credit(16, 32, 2) == pytest.approx(32)  # every request advanced two: the end did too
    assert g.credit(16, 20, 4) == 20  # never more than the tokens
    assert SpecGovernor().credit(16, 17, 1) == 17  # before the plain fit: as emitted


def test_drafting_that_does_not_move_a_drains_end_loses_to_plain_steps():
    """A drain of 16 requests at 60 ms + 3 ms a request: drafting steps of 18 tokens, 7 % slower than plain ones, win
    by tokens/s (18 / 16 > 1.07), but only the rows of the extra tokens are saved (the end does not move): plain."""
    plain_s = 0.06 + 0.003 * 16
    for critical, wins in [(None, True), (1, False)]:
        g = fitted(0.06, 0.003)
        g.forget_drafting()
        used = []
        for _ in range(400):
            spec = g.use_spec(16)
            if spec:
                g.observe(16, True, tokens=18, seconds=1.07 * plain_s, critical=critical)
            else:
                g.observe(16, False, tokens=16, seconds=plain_s)
            used.append(spec)
        assert (sum(used[-100:]) > 50) == wins, (critical, sum(used[-100:]))


class EagerGovernor(SpecGovernor):
    """The reference: decides at every step (no countdown over steps whose decision it knows) and folds each queued
    plain step in with ``_observe`` (not the inlined ``_fold_plain``)."""

    def _steps_plain(self, bsz: int, rules) -> tuple[int, int]:
        return 0, 0

    def _fold_plain(self, queue) -> None:
        for bsz, tokens, seconds, prefill, wall in queue:
            self._observe(bsz, False, tokens, seconds, prefill, wall)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 3, 4, 6, 16, 17, 31, 64]),  # batch size of a stretch of steps
            st.integers(1, 300),  # its length
            st.floats(0.2, 3.0),  # a drafting step's time over a plain one's
            st.booleans(),  # a new history step before it
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([0.0, 0.01, 0.05, math.inf]),
    st.integers(0, 2**16),
)
def test_counting_down_known_plain_steps_decides_as_deciding_every_step(stretches, budget, seed):
    """The countdowns over steps whose plain decision is known (the budget short, or the bucket's rules before the
    next probe), the queue of plain observations and its inlined fold change no decision and no measurement: the
    same steps give the same decisions, stats, rates and plain fit as the reference, which decides at every step
    and observes each plain step on its own."""
    rng = random.Random(seed)
    fast, eager = (cls(GovernorConfig(explore_budget=budget)) for cls in (SpecGovernor, EagerGovernor))
    for bsz, length, slowdown, new_history in stretches:
        if new_history:
            fast.forget_drafting(), eager.forget_drafting()
        low = 1 << (bsz.bit_length() - 1)
        for k in range(length):
            r = rng.random()  # now and then another of its bucket, or of the bucket below (a batch of 64, then 63)
            n = bsz if r < 0.6 else rng.randrange(low, 2 * low) if r < 0.85 else max(1, low - 1)
            spec = fast.use_spec(n)
            assert spec == eager.use_spec(n), k
            jitter = rng.choice([1.0, 1.0, 1.0, rng.uniform(0.8, 1.6)])  # runs of equal steps, and outliers
            seconds = (0.002 + 1e-4 * n) * jitter * (slowdown if spec else 1.0)
            prefill = rng.choice([0, 0, 0, rng.randrange(1, 64)])  # merged prefills, priced by the plain fit
            for g in (fast, eager):
                g.observe(n, spec, tokens=n, seconds=seconds, prefill=prefill, wall_s=seconds * (1 + prefill / 500))
    assert fast.stats == eager.stats and fast.rates() == eager.rates()
    assert fast._plain._coef.tolist() == eager._plain._coef.tolist() and fast._decode_s == eager._decode_s
    assert fast.within_budget() == eager.within_budget()


@pytest.mark.parametrize("sizes", [(64,), (64, 63), (64, 63, 62, 31)])
def test_a_stretch_of_short_budget_steps_checks_the_budget_rarely(monkeypatch, sizes):
    """Where drafting does not pay, a plain step must cost what a plain engine's does: the governor counts down over
    steps it knows the budget to be short for instead of checking each, in each bucket on its own (a batch whose
    finished requests are replaced a step later moves between 64 and 63, two buckets)."""
    g = SpecGovernor()
    checks = []
    room = g._room
    monkeypatch.setattr(g, "_room", lambda bsz: checks.append(bsz) or room(bsz))
    used = []
    for k in range(1000):
        bsz = sizes[k % len(sizes)]
        spec = g.use_spec(bsz)
        g.observe(bsz, spec, tokens=bsz, seconds=bsz * (0.009 if spec else 0.003) / 64)
        used.append(spec)
    assert 0 < sum(used) < 20 and g.stats["budget_plain_steps"] > 900
    assert len(checks) < len({bsz.bit_length() for bsz in sizes}) * 1000 / 4  # each bucket's own countdowns


@pytest.mark.parametrize(
    "wall_cap, extra_s, rated",
    [
        (0.1, 0.016, 1.1 * (0.034 + 0.016)),  # an 86-ms spike counts as 1.1 x (a plain step + its extra cost)
        (0.1, None, 0.086),  # nothing modelled: as measured
        (math.inf, 0.016, 0.086),  # no cap
        (0.1, 0.05, 0.086),  # within the cap: as measured
    ],
)
def test_a_drafting_steps_rate_counts_at_most_its_modelled_cost(wall_cap, extra_s, rated):
    """A noise spike on one probe must not decide drafting off for many steps: the rates see a drafting step's decode
    seconds at most ``1 + wall_cap`` times the plain fit's step plus the cost the caller models beyond it, while the
    explore budget counts the wall as measured."""
    g, ref = (fitted(0.01, 0.006, GovernorConfig(wall_cap=wall_cap)) for _ in range(2))  # 34 ms at batch 4
    for gov in (g, ref):
        gov.forget_drafting()
    assert g.rate_seconds(4, 0.086, extra_s) == pytest.approx(rated)
    g.observe(4, True, tokens=7, seconds=0.086, extra_s=extra_s)
    ref.observe(4, True, tokens=7, seconds=0.086)
    assert g.rates()[3][1] == pytest.approx(7 / rated)
    assert g.within_budget() == ref.within_budget() and g._excess == ref._excess  # the budget: the measured wall


def test_a_spiked_probe_makes_the_next_wait_only_as_long_as_its_capped_cost():
    """The room a bucket's next probe waits for predicts that probe's cost: a one-off spike (the machine's noise)
    beyond ``wall_cap`` does not raise it above that of a probe at the capped time; the budget still counts the
    spike (the explore budget's excess is the measured wall's)."""
    rooms, excess = [], []
    for seconds, extra_s in [(0.6, 0.016), (1.1 * (0.034 + 0.016), None)]:
        g = fitted(0.01, 0.006)
        g.forget_drafting()
        g.observe(4, True, tokens=4, seconds=seconds, extra_s=extra_s)
        rooms.append(g._probe_room(4, g._buckets[3]))
        excess.append(g._excess)
    assert rooms[0] == pytest.approx(rooms[1]) and rooms[0] > 0
    assert excess[0] > excess[1] + 0.5  # the spike's 0.545 s: in the budget
