"""trace stats: hand-computed reuse and rank moves, correlations against scipy, epochs from visits."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_histospec.trace.format import TraceRecord
from sglang_histospec.trace.stats import (
    average_ranks,
    kendall,
    rank_moved_share,
    self_coverage,
    spearman,
    trace_stats,
)


def rec(step, pid, resp, sample=0, epoch=None):
    return TraceRecord(step, pid, sample, [1], list(resp), epoch=epoch)


def test_token_reuse_hand_computed():
    # m = 3: previous 3-grams 123 234 345 456; current [1,2,3,9,4,5,6]: 123 and 456 occur -> 6 of 7 tokens
    recs = [rec(0, "a", [1, 2, 3, 4, 5, 6]), rec(1, "a", [1, 2, 3, 9, 4, 5, 6])]
    s = trace_stats(recs, min_match=3)
    assert s.epoch_source == "visit" and s.epochs == 2
    (p,) = s.pairs
    assert p.token_reuse == pytest.approx(6 / 7) and p.responses == 1 and p.prompts == 1
    assert trace_stats(recs, min_match=4).pairs[0].token_reuse == 0.0  # 1239 2394 3945 9456: none occurs


def test_rank_moves_and_correlations_hand_computed():
    # lengths epoch 0: 10 20 30 40, epoch 1: 10 20 40 30 -> ranks move by 1/4 for two prompts
    recs = [rec(0, f"p{i}", [7] * n, epoch=0) for i, n in enumerate([10, 20, 30, 40])]
    recs += [rec(1, f"p{i}", [7] * n, epoch=1) for i, n in enumerate([10, 20, 40, 30])]
    (p,) = trace_stats(recs, min_match=2).pairs
    assert p.rank_moved_share == 0.5
    assert p.spearman == pytest.approx(0.8)  # 1 - 6 * 2 / (4 * 15)
    assert p.kendall == pytest.approx(4 / 6)  # 5 concordant, 1 discordant pair
    assert p.token_reuse == 1.0


def test_epochs_from_visits_and_missing_prompts():
    recs = [rec(0, "a", [1, 2]), rec(1, "b", [3, 4]), rec(2, "a", [1, 2]), rec(3, "c", [5])]
    s = trace_stats(recs, min_match=1)
    assert s.epochs == 2 and len(s.pairs) == 1 and s.pairs[0].prompts == 1
    out = s.to_json()
    assert out["pairs"][0]["spearman"] is None  # one prompt: undefined, reported as null


@pytest.mark.filterwarnings("ignore:An input array is constant")
def test_correlations_match_scipy():
    import scipy.stats as st

    rng = np.random.default_rng(0)
    for n in (2, 5, 40, 500):
        for _ in range(3):
            x, y = rng.integers(0, 6, n), rng.integers(0, 6, n)
            for ours, ref in (
                (spearman(x, y), st.spearmanr(x, y).statistic),
                (kendall(x, y), st.kendalltau(x, y).statistic),
            ):
                assert (np.isnan(ours) and np.isnan(ref)) or ours == pytest.approx(ref, abs=1e-12)


def test_average_ranks_and_validation():
    assert average_ranks([10, 30, 20, 20]).tolist() == [0.0, 3.0, 1.5, 1.5]
    assert rank_moved_share([1, 2, 3], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError, match="min_match"):
        trace_stats([rec(0, "a", [1])], min_match=0)
    with pytest.raises(ValueError, match="no records"):
        trace_stats([])
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


@pytest.mark.parametrize(
    ("response", "m", "covered"),
    [
        ([1, 2, 3, 1, 2], 2, 2),  # 12 recurs
        ([1, 2, 3, 4], 2, 0),  # nothing recurs
        ([5, 5, 5, 5], 2, 3),  # 55 at positions 1 and 2 recur: tokens 1..3
        ([1, 2, 1, 2, 1, 2], 3, 4),  # 121 and 212 recur from position 2: tokens 2..5
        ([7], 1, 0),
        ([7, 7], 1, 1),
    ],
)
def test_self_coverage_hand_computed(response, m, covered):
    assert self_coverage(response, m) == covered


def test_self_coverage_matches_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(50):
        r, m = rng.integers(0, 3, int(rng.integers(1, 30))).tolist(), int(rng.integers(1, 4))
        grams = [tuple(r[j : j + m]) for j in range(len(r) - m + 1)]
        cov = {j + k for j, g in enumerate(grams) if g in grams[:j] for k in range(m)}
        assert self_coverage(r, m) == len(cov)


def test_trace_level_self_reuse_and_cut_share():
    recs = [rec(0, "a", [1, 2, 3, 1, 2]), rec(0, "a", [4, 5], sample=1), rec(1, "a", [6, 7, 8, 9, 0])]
    s = trace_stats(recs, min_match=2)
    assert s.self_reuse == pytest.approx(2 / 12)
    assert s.at_length_max_share == pytest.approx(2 / 3)
    assert s.to_json()["self_reuse"] == round(2 / 12, 6)
