"""The cost-aware cut: the online step-time model and best_cut against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting.draft_cut import StepCostConfig, StepCostModel, best_cut


def _best_ratio(probs_desc, base_tokens, base_cost, row_cost):
    """Reference: the best tokens-per-second over every prefix, by enumeration."""
    return max((base_tokens + sum(probs_desc[:k])) / (base_cost + row_cost * k) for k in range(len(probs_desc) + 1))


def test_docstring_examples():
    assert best_cut(np.array([0.9, 0.5, 0.05]), 4, 1.0, 0.1) == 2
    model = StepCostModel()
    for extra in (0, 32, 64, 256) * 4:
        model.observe(16, 16 + extra, 0.002 + 0.000005 * extra)
    assert model.ready
    assert model.row_cost() == pytest.approx(5e-6, rel=1e-3)
    assert model.base_cost(16) == pytest.approx(0.002, rel=1e-3)
    assert best_cut(np.array([0.9, 0.8, 0.1, 0.01]), 16, model.base_cost(16), model.row_cost()) == 3


def test_prefill_tokens_are_priced_apart_from_draft_rows():
    """A merged prefill token adds a forward row but none of a draft node's host work: fitted with one row term,
    prefill-heavy steps would price draft rows at the cheaper rate."""
    model = StepCostModel()
    for extra, prefill in ((0, 0), (32, 0), (0, 200), (64, 100), (16, 300)) * 4:
        model.observe(16, 16 + extra, 0.002 + 40e-6 * extra + 5e-6 * prefill, prefill=prefill)
    assert model.row_cost() == pytest.approx(40e-6, rel=1e-3)
    assert model.prefill_cost() == pytest.approx(5e-6, rel=1e-3)
    assert model.base_cost(16) == pytest.approx(0.002, rel=1e-3)
    no_prefill = StepCostModel()
    for extra in (0, 32, 64) * 6:
        no_prefill.observe(16, 16 + extra, 0.002 + 40e-6 * extra)
    assert no_prefill.prefill_cost() == pytest.approx(0.0, abs=1e-9)  # never seen: no cost invented
    with pytest.raises(ValueError, match="prefill"):
        model.observe(16, 16, 0.002, prefill=-1)


@pytest.mark.parametrize(
    "probs, base_tokens, base_cost, row_cost, expected",
    [
        ([], 4, 1.0, 0.1, 0),  # nothing drafted
        ([0.9, 0.8], 4, 1.0, 0.0, 2),  # free rows: keep everything
        ([0.9, 0.8], 4, 1.0, 10.0, 0),  # rows far dearer than a step: keep nothing
        ([0.9, 0.5, 0.05], 4, 1.0, 0.1, 2),
        ([0.09, 0.05], 4, 1.0, 0.1, 0),  # unlikely nodes do not pay for their rows
    ],
)
def test_best_cut_table(probs, base_tokens, base_cost, row_cost, expected):
    assert best_cut(np.array(probs, dtype=np.float64), base_tokens, base_cost, row_cost) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), max_size=40),
    st.integers(1, 64),
    st.floats(1e-4, 1.0),
    st.floats(0.0, 0.1),
)
def test_best_cut_matches_brute_force(probs, base_tokens, base_cost, row_cost):
    probs_desc = np.array(sorted(probs, reverse=True), dtype=np.float64)
    k = best_cut(probs_desc, base_tokens, base_cost, row_cost)
    got = (base_tokens + probs_desc[:k].sum()) / (base_cost + row_cost * k)
    assert got == pytest.approx(_best_ratio(list(probs_desc), base_tokens, base_cost, row_cost), rel=1e-9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(base_cost=0.0, row_cost=0.1, base_tokens=4), "base_cost"),
        (dict(base_cost=1.0, row_cost=-0.1, base_tokens=4), "row_cost"),
        (dict(base_cost=1.0, row_cost=0.1, base_tokens=0), "base_tokens"),
    ],
)
def test_best_cut_rejects_bad_costs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        best_cut(np.array([0.5]), **kwargs)


def test_model_fits_noisy_steps_and_tracks_changes():
    rng = np.random.default_rng(0)
    model = StepCostModel(StepCostConfig(decay=0.98))
    assert not model.ready and model.row_cost() == 0.0
    for _ in range(400):
        batch = int(rng.integers(1, 17))
        rows = batch + int(rng.integers(0, 16 * batch + 1))
        model.observe(batch, rows, 0.001 + 0.0001 * batch + 0.00001 * (rows - batch) + rng.normal(0, 2e-5))
    assert model.row_cost() == pytest.approx(1e-5, rel=0.1)
    assert model.base_cost(8) == pytest.approx(0.0018, rel=0.1)
    for _ in range(400):  # the machine got slower per row: the decayed fit follows
        batch = int(rng.integers(1, 17))
        rows = batch + int(rng.integers(0, 16 * batch + 1))
        model.observe(batch, rows, 0.001 + 0.0001 * batch + 0.00004 * (rows - batch))
    assert model.row_cost() == pytest.approx(4e-5, rel=0.1)


def test_row_cost_never_negative_and_unidentified_rows_cut_nothing():
    model = StepCostModel()
    for _ in range(32):  # no extra rows were ever measured: the row term stays 0
        model.observe(4, 4, 0.002)
    assert model.ready and model.row_cost() == 0.0
    assert best_cut(np.array([0.9, 0.6, 0.3]), 4, model.base_cost(4), model.row_cost()) == 3
    falling = StepCostModel()
    for rows in (4, 40) * 16:  # more rows measured faster (noise): clamped to 0, not negative
        falling.observe(4, rows, 0.003 if rows == 4 else 0.002)
    assert falling.row_cost() == 0.0


def test_a_step_never_costs_less_than_nothing_at_a_batch_size_not_measured():
    """Steps measured at batch 64 and a few smaller ones whose times fall faster than linearly: the fit's
    intercept would go negative and price a step of 41 requests at about 0 (a free probe for the governor)."""
    model = StepCostModel()
    for batch, seconds in [(64, 0.0030)] * 40 + [(60, 0.0026), (56, 0.0022)] * 4:
        model.observe(batch, batch, seconds)
    assert model.base_cost(41) > 0.25 * model.base_cost(64)
    assert model.base_cost(64) == pytest.approx(0.0030, rel=0.1)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: StepCostConfig(decay=1.0), "decay"),
        (lambda: StepCostConfig(min_steps=2), "min_steps"),
        (lambda: StepCostConfig(refit_every=0), "refit_every"),
        (lambda: StepCostConfig(seed_decay=0.0), "seed_decay"),
        (lambda: StepCostConfig(pause_steps=-1), "pause_steps"),
    ],
)
def test_config_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("batch, rows, seconds", [(0, 1, 0.1), (4, 3, 0.1), (4, 4, -1.0)])
def test_observe_rejects_bad_input(batch, rows, seconds):
    with pytest.raises(ValueError):
        StepCostModel().observe(batch, rows, seconds)


def test_weighted_observations_count_as_several_steps():
    model = StepCostModel()
    for extra in (0, 32, 64, 256):  # 4 observations standing for min_steps steps: ready at once
        model.observe(16, 16 + extra, 0.002 + 0.000005 * extra, weight=4.0)
    assert model.ready
    assert model.row_cost() == pytest.approx(5e-6, rel=1e-3)
    with pytest.raises(ValueError, match="weight"):
        model.observe(16, 16, 0.002, weight=0.0)


def test_seeded_steps_fade_as_real_steps_come_in():
    """Dummy passes seed 3 ms a row; real steps cost 5 ms a row: within 30 real steps the fit follows them (with
    decay alone the seeds would still weigh about half)."""
    model = StepCostModel()
    for extra in (0, 16, 0, 33):
        model.observe(8, 8 + extra, 0.1 + 0.003 * extra, weight=4.0, seeded=True)
    assert model.ready and model.row_cost() == pytest.approx(0.003, rel=1e-3)
    for i in range(30):
        extra = (0, 8, 24)[i % 3]
        model.observe(16, 16 + extra, 0.18 + 0.005 * extra)
    assert model.ready and model.row_cost() == pytest.approx(0.005, rel=0.1)


def _reference_sums(cfg: StepCostConfig, steps) -> tuple[np.ndarray, np.ndarray]:
    """Reference: the decayed sums updated step by step, as the model's docstring states them."""
    xx, xy = np.zeros((2, 4, 4)), np.zeros((2, 4))
    for batch, extra, prefill, seconds, weight, seeded in steps:
        x = np.array([1.0, batch, extra, prefill])
        if not seeded:
            xx *= cfg.decay
            xy *= cfg.decay
            xx[1] *= cfg.seed_decay
            xy[1] *= cfg.seed_decay
        xx[int(seeded)] += weight * np.outer(x, x)
        xy[int(seeded)] += weight * x * seconds
    return xx, xy


_STEP = st.tuples(
    st.integers(1, 64),
    st.integers(0, 300),
    st.integers(0, 400),
    st.floats(0.0, 0.1),
    st.floats(0.05, 4.0),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(_STEP, max_size=150), refit_every=st.integers(1, 12))
def test_buffered_sums_match_step_by_step_reference(steps, refit_every):
    """The model buffers observations and adds them at a refit (or every PENDING_MAX): the sums it solves are the
    step-by-step reference's, whatever the mix of real and seeded steps and refits in between."""
    cfg = StepCostConfig(refit_every=refit_every, min_steps=3)
    model = StepCostModel(cfg)
    for i, (batch, extra, prefill, seconds, weight, seeded) in enumerate(steps):
        model.observe(batch, batch + extra, seconds, weight=weight, seeded=seeded, prefill=prefill)
        if i % 5 == 0:
            model.base_cost(batch)  # a refit now and then folds the buffer
    model._fold()
    xx, xy = _reference_sums(cfg, steps)
    np.testing.assert_allclose(model._xx, xx, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model._xy, xy, rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 64), st.integers(0, 400), st.floats(0.0, 0.1)), max_size=200),
    chunk=st.integers(1, 70),
    refit_every=st.integers(1, 12),
)
def test_observe_plain_is_observe_of_each_step(steps, chunk, refit_every):
    """``observe_plain`` of a list of plain steps leaves the model as ``observe`` of each, in chunks and with refits
    in between: the same sums, counts, staleness and fit."""
    cfg = StepCostConfig(refit_every=refit_every, min_steps=3)
    one, many = StepCostModel(cfg), StepCostModel(cfg)
    for start in range(0, len(steps), chunk):
        part = steps[start : start + chunk]
        for batch, prefill, seconds in part:
            one.observe(batch, batch, seconds, prefill=prefill)
        many.observe_plain(part)
        assert (one._n, one._steps, one._since_fit, one._stale) == (many._n, many._steps, many._since_fit, many._stale)
        assert one.base_cost(4) == many.base_cost(4) and one.prefill_cost() == many.prefill_cost()
    assert one._xx.tolist() == many._xx.tolist() and one._xy.tolist() == many._xy.tolist()


@pytest.mark.parametrize("weight", [1.0, 0.25, 3.0])
def test_refits_come_after_1_2_4_steps_then_every_refit_every_whatever_the_weights(weight):
    """The early refit schedule counts observations, not their weights."""
    model = StepCostModel(StepCostConfig(min_steps=3, refit_every=8))
    fits = []
    for step in range(1, 41):
        model.observe(4, 4 + step % 3, 0.01 + 0.001 * (step % 3), weight=weight)
        stale = model._stale and model.ready
        model.base_cost(4)
        if stale:
            fits.append(step)
    assert fits[0] == math.ceil(3 / weight)  # ready: min_steps of weight
    # then each refit comes after as many steps as were in at the last one, at most refit_every
    assert all(b - a == min(8, a) for a, b in zip(fits, fits[1:])) and fits[-1] > 40 - 8
