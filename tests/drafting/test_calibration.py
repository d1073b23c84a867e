"""DraftCalibration against a dict-based reference of its formula; conditional learning, decay, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting.calibration import (
    BIN_EDGES,
    CALIBRATED_SOURCES,
    KEY_SOURCES,
    MATCH_EDGES,
    NUM_KEYS,
    CalibrationConfig,
    DraftCalibration,
    draft_key,
)
from sglang_histospec.drafting.types import Draft


class RefCalibration:
    """Reference: the three shrinkage levels of the module docstring over plain dicts (no decay)."""

    def __init__(self, cfg: CalibrationConfig) -> None:
        self.cfg = cfg
        self.obs: list[tuple[int, int, float, bool]] = []  # (key, bin, prob, accepted)

    def observe(self, probs, keys, accepted) -> None:
        for p, k, a in zip(probs, keys, accepted):
            self.obs.append((int(k), int(np.searchsorted(BIN_EDGES, p, side="left")), float(p), bool(a)))

    def calibrate(self, p: float, key: int) -> float:
        b = int(np.searchsorted(BIN_EDGES, p, side="left"))
        if KEY_SOURCES[key // (len(MATCH_EDGES) + 1)] in CALIBRATED_SOURCES:
            return p
        w, scale = self.cfg.prior_nodes, self.cfg.prior_scale
        pooled = [o for o in self.obs if o[1] == b]
        mean = sum(o[2] for o in pooled) / len(pooled) if pooled else p
        level1 = (sum(o[3] for o in pooled) + w * scale * mean) / (len(pooled) + w)
        own = [o for o in pooled if o[0] == key]
        return (sum(o[3] for o in own) + w * level1) / (len(own) + w)


def test_docstring_example():
    cal = DraftCalibration(CalibrationConfig(prior_nodes=4.0, prior_scale=0.5))
    d = Draft([5, 6], [-1, 0], [1.0, 1.0], match_len=3, source="history")
    assert cal.calibrate_draft(d).tolist() == [0.5, 0.25]
    cal.observe_draft(d, [True, False])
    pooled = (1 + 4 * 0.5 * 1.0) / (2 + 4)
    q = (1 + 4 * pooled) / (2 + 4)
    assert cal.calibrate_draft(d).tolist() == pytest.approx([q, q * q])


def test_conditional_probabilities_and_what_teaches():
    # root -> 5 (0.8) -> 6 (0.4); root -> 7 (0.2)
    d = Draft([5, 7, 6], [-1, -1, 0], [0.8, 0.2, 0.4], match_len=2, source="siblings")
    cond, parents, keys = DraftCalibration.flatten([d, d], [3, 2])  # the second cut to its first 2 nodes
    assert cond.tolist() == pytest.approx([0.8, 0.2, 0.5, 0.8, 0.2]) and parents.tolist() == [-1, -1, 0, -1, -1]
    assert keys.tolist() == [draft_key("siblings", 2)] * 5
    cal = DraftCalibration(CalibrationConfig(half_life_nodes=math.inf))
    cal.observe_draft(d, [False, True, False])  # node 2's parent was rejected: it teaches nothing
    assert sum(r["nodes"] for r in cal.table()) == 2
    cal.observe_draft(d, [True, False, False], verified=[True, False, True])  # node 1 was cut: not verified
    assert sum(r["nodes"] for r in cal.table()) == 4


@pytest.mark.parametrize(
    "source, match_len, expected",
    [
        ("history", 1, 0),
        ("history", 2, 1),
        ("history", 4, 2),
        ("history", 5, 3),
        ("history", 100, 4),
        ("siblings", 0, len(MATCH_EDGES) + 1),  # match length 0 counts as 1
        ("unknown", 3, (len(KEY_SOURCES) - 1) * (len(MATCH_EDGES) + 1) + 2),  # anything else counts as ""
    ],
)
def test_draft_key_table(source, match_len, expected):
    assert draft_key(source, match_len) == expected
    assert 0 <= expected < NUM_KEYS


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, NUM_KEYS - 1), st.booleans()), min_size=0, max_size=60),
    st.floats(0.01, 1.0),
    st.integers(0, NUM_KEYS - 1),
)
def test_matches_reference(obs, query_p, query_key):
    cfg = CalibrationConfig(half_life_nodes=math.inf)
    cal, ref = DraftCalibration(cfg), RefCalibration(cfg)
    for chunk in (obs[: len(obs) // 2], obs[len(obs) // 2 :]):  # two "steps"
        probs = np.array([o[0] for o in chunk], dtype=np.float64)
        keys = np.array([o[1] for o in chunk], dtype=np.int64)
        acc = np.array([o[2] for o in chunk], dtype=bool)
        cal.observe(probs, keys, acc)
        ref.observe(probs, keys, acc)
    got = cal.calibrate(np.array([query_p]), np.array([query_key]))[0]
    assert got == pytest.approx(ref.calibrate(query_p, query_key), abs=1e-9)
    assert 0.0 <= got <= 1.0


def test_learns_each_source_apart():
    rng = np.random.default_rng(1)
    cal = DraftCalibration(CalibrationConfig(half_life_nodes=math.inf))
    true_rate = {"history": 0.8, "siblings": 0.1}  # the same drafted probability, different sources
    for _ in range(400):
        for source, rate in true_rate.items():
            d = Draft([1, 2, 3], [-1, 0, 1], [1.0, 1.0, 1.0], match_len=6, source=source)
            hits = np.cumprod(rng.random(3) < rate).astype(bool)  # a chain: accepted up to the first miss
            cal.observe_draft(d, hits)
    for source, rate in true_rate.items():
        d = Draft([1, 2], [-1, 0], [1.0, 1.0], match_len=6, source=source)
        np.testing.assert_allclose(cal.calibrate_draft(d), [rate, rate * rate], atol=0.05)
    per = cal.by_source()
    assert set(per) == {"history", "siblings"} and per["history"]["nodes"] > per["siblings"]["nodes"] >= 400
    assert cal.table()[0]["upper"] == 1.0


def test_decay_halves_weight_after_half_life():
    cal = DraftCalibration(CalibrationConfig(half_life_nodes=1.0))
    cal.observe(np.array([0.55]), np.array([0]), np.array([True]))
    cal.observe(np.array([0.55]), np.array([0]), np.array([False]))  # one node later: the first weighs half
    row = cal.table()[0]
    assert row["nodes"] == pytest.approx(1.5) and row["accepted"] == pytest.approx(0.5 / 1.5)
    cal.observe(np.array([]), np.array([], dtype=np.int64), np.array([], dtype=bool))  # nothing observed: no decay
    assert cal.table()[0]["nodes"] == pytest.approx(1.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=5), st.integers(0, 2**31 - 1))
def test_batched_calibration_matches_one_draft_at_a_time(sizes, seed):
    rng = np.random.default_rng(seed)
    drafts = []
    for n in sizes:  # random BFS-ordered trees with path probabilities falling along each path
        parents = [-1 if i == 0 or rng.random() < 0.3 else int(rng.integers(0, i)) for i in range(n)]
        probs = []
        for p in parents:
            probs.append(float((1.0 if p < 0 else probs[p]) * rng.uniform(0.05, 1.0)))
        drafts.append(Draft(list(range(n)), parents, probs, int(rng.integers(0, 12)), "mixed"))
    cal = DraftCalibration()
    for d in drafts:  # some data first, so that keys and bins differ
        cal.observe_draft(d, rng.random(len(d)) < 0.5)
    batched = cal.calibrate_drafts(drafts)
    one = np.concatenate([np.asarray(_slow_path_product(cal, d)) for d in drafts] or [np.zeros(0)])
    np.testing.assert_allclose(batched, one, rtol=1e-12)


def _slow_path_product(cal: DraftCalibration, d: Draft) -> list[float]:
    """Reference: calibrated conditionals multiplied along each path, one node at a time."""
    cond, parents, keys = cal.flatten([d])
    q = cal.calibrate(cond, keys)
    out: list[float] = []
    for i, par in enumerate(parents.tolist()):
        out.append(float(q[i]) * (out[par] if par >= 0 else 1.0))
    return out


def test_prior_trusts_an_unmeasured_drafter_little():
    cal = DraftCalibration()
    got = cal.calibrate(np.array([1.0, 0.4]), np.array([0, 0]))
    assert got.tolist() == pytest.approx([0.25, 0.1])
    d = Draft([1, 2, 3], [-1, 0, 1], [1.0, 1.0, 1.0], match_len=9, source="history")
    assert cal.calibrate_draft(d).tolist() == pytest.approx([0.25, 0.25**2, 0.25**3])  # a product along the path


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"half_life_nodes": 0.0}, "half_life_nodes"),
        ({"prior_nodes": 0.0}, "prior_nodes"),
        ({"prior_scale": 0.0}, "prior_scale"),
        ({"prior_scale": 1.5}, "prior_scale"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CalibrationConfig(**kwargs)


def test_observe_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one each per node"):
        DraftCalibration().observe(np.array([0.5, 0.6]), np.array([0, 0]), np.array([True]))


def test_observe_tokens_walks_the_committed_tokens():
    # root -> 5 -> 6 and root -> 7; SGLang / replay committed 5 then 9 (6 rejected, 9 the bonus token)
    d = Draft([5, 7, 6], [-1, -1, 0], [0.6, 0.4, 0.6], match_len=2, source="history")
    cal = DraftCalibration(CalibrationConfig(half_life_nodes=math.inf))
    hit = cal.observe_tokens(d, [5, 9])
    assert hit.tolist() == [True, False, False]
    assert sum(r["nodes"] for r in cal.table()) == 3  # every node's parent is the root or the accepted 5
    assert sum(r["nodes"] * r["accepted"] for r in cal.table()) == pytest.approx(1.0)


def test_calibrated_sources_pass_through():
    """An anchor draft's probabilities are calibrated already: they stand, before and after outcomes are counted;
    other sources get prior_scale times theirs, then learn."""
    cal = DraftCalibration(CalibrationConfig(prior_scale=0.25))
    anchors = Draft([5, 6], [-1, 0], [0.8, 0.4], match_len=3, source="anchors")
    history = Draft([5, 6], [-1, 0], [0.8, 0.4], match_len=3, source="history")
    assert cal.calibrate_draft(anchors).tolist() == pytest.approx([0.8, 0.4])
    assert cal.calibrate_draft(history).tolist() == pytest.approx([0.2, 0.2 * 0.125])
    for _ in range(50):
        cal.observe_draft(anchors, [False, False])
        cal.observe_draft(history, [False, False])
    assert cal.calibrate_draft(anchors).tolist() == pytest.approx([0.8, 0.4])
    assert cal.calibrate_draft(history)[0] < 0.05
    assert cal.by_source()["anchors"]["nodes"] > 0
