"""The cost-aware cut: the online step-time model and best_cut against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.core.stepcost import StepCostConfig, StepCostModel, best_cut


def _brute_force(probs_desc, base_tokens, base_cost, row_cost, kappa):
    ratios = [
        (base_tokens + kappa * sum(probs_desc[:k])) / (base_cost + row_cost * k) for k in range(len(probs_desc) + 1)
    ]
    return ratios.index(max(ratios)), max(ratios)


def test_docstring_examples():
    assert best_cut(np.array([0.9, 0.5, 0.05]), 4, 1.0, 0.1) == 2
    model = StepCostModel()
    for extra in (0, 32, 64, 256) * 4:
        model.observe(16, 16 + extra, 0.002 + 0.000005 * extra)
    assert model.ready
    assert model.row_cost() == pytest.approx(5e-6, rel=1e-3)
    assert model.base_cost(16) == pytest.approx(0.002, rel=1e-3)
    c = model.row_cost()
    assert best_cut(np.array([0.9, 0.8, 0.1, 0.01]), 16, model.base_cost(16), c) == 3


@pytest.mark.parametrize(
    "probs, base_tokens, base_cost, row_cost, kappa, expected",
    [
        ([], 4, 1.0, 0.1, 1.0, 0),  # nothing drafted
        ([0.9, 0.8], 4, 1.0, 0.0, 1.0, 2),  # free rows: keep everything
        ([0.9, 0.8], 4, 1.0, 10.0, 1.0, 0),  # rows far dearer than a step: keep nothing
        ([0.9, 0.5, 0.05], 4, 1.0, 0.1, 1.0, 2),
        ([0.9, 0.5, 0.05], 4, 1.0, 0.1, 0.1, 0),  # a badly calibrated drafter earns less per node
    ],
)
def test_best_cut_table(probs, base_tokens, base_cost, row_cost, kappa, expected):
    assert best_cut(np.array(probs, dtype=np.float64), base_tokens, base_cost, row_cost, kappa) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), max_size=40),
    st.integers(1, 64),
    st.floats(1e-4, 1.0),
    st.floats(0.0, 0.1),
    st.floats(0.05, 2.0),
)
def test_best_cut_matches_brute_force(probs, base_tokens, base_cost, row_cost, kappa):
    probs_desc = np.array(sorted(probs, reverse=True), dtype=np.float64)
    k = best_cut(probs_desc, base_tokens, base_cost, row_cost, kappa)
    _, best = _brute_force(list(probs_desc), base_tokens, base_cost, row_cost, kappa)
    got = (base_tokens + kappa * probs_desc[:k].sum()) / (base_cost + row_cost * k)
    assert got == pytest.approx(best, rel=1e-9)


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
    for _ in range(32):  # rows never vary beyond the batch: the row term cannot be told apart
        model.observe(4, 4, 0.002)
    assert model.ready
    assert model.row_cost() == 0.0
    assert best_cut(np.array([0.9, 0.6, 0.3]), 4, model.base_cost(4), model.row_cost()) == 3
    falling = StepCostModel()
    for rows in (4, 40) * 16:  # more rows measured faster (noise): clamped to 0, not negative
        falling.observe(4, rows, 0.003 if rows == 4 else 0.002)
    assert falling.row_cost() == 0.0


@pytest.mark.parametrize(
    "accepted, drafted, expected", [(0, 0, 1.0), (10, 20, 18 / 28), (0, 1000, 0.05), (900, 100, 2.0)]
)
def test_kappa_is_a_smoothed_bounded_ratio(accepted, drafted, expected):
    model = StepCostModel(StepCostConfig(decay=0.5, kappa_prior=8.0))
    model.observe_acceptance(drafted, accepted)
    assert model.kappa == pytest.approx(expected)


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(decay=1.0), "decay"), (dict(min_steps=2), "min_steps"), (dict(kappa_prior=0.0), "kappa_prior")],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepCostConfig(**kwargs)


@pytest.mark.parametrize("batch, rows, seconds", [(0, 1, 0.1), (4, 3, 0.1), (4, 4, -1.0)])
def test_observe_rejects_bad_input(batch, rows, seconds):
    with pytest.raises(ValueError):
        StepCostModel().observe(batch, rows, seconds)
