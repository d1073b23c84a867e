"""The anchor scorer (``DrafterConfig(scorer="anchors")``, docs/drafting.md section 13): hand-computed cases,
learning, and hypothesis invariants, on every available backend (tests/drafting/test_anchors_native.py compares
the backends call by call)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.anchors import (
    COPY_PRIOR,
    DEPTH_MAX,
    FEATURE_SIZES,
    HAM_WINDOW,
    NUM_CLASSES,
    NUM_WEIGHTS,
    RATE_PRIOR,
    RERANK_LR,
    AnchorIndex,
    _Pending,
    anchor_class,
    length_class,
    node_features,
    rewritten,
)
from sglang_histospec.drafting.reference import ReferenceIndex
from sglang_histospec.drafting.types import COUNTS_SOURCES, SOURCES, WEIGHT_ONE

try:
    from sglang_histospec.drafting.native import NativeIndex
    from sglang_histospec.drafting.native_anchors import NativeAnchorIndex

    INDEXES = {"python": AnchorIndex, "native": NativeAnchorIndex}
except (ImportError, AttributeError):
    INDEXES, NativeIndex = {"python": AnchorIndex}, None
BACKENDS = list(INDEXES)

P1, P2, P3, P4 = (RATE_PRIOR**d for d in (1, 2, 3, 4))  # the prior hit rates at depths 1-4 before any learning
C = COPY_PRIOR  # a rewritten copy's prior rates, relative to an original's


def drafter(backend: str, **kw) -> HistoSpecDrafter:
    return HistoSpecDrafter(DrafterConfig(scorer="anchors", backend=backend, **kw))


def tries(idx) -> int:
    """How many (anchor, depth) outcomes an index has learnt from."""
    return int(idx._tries.sum() if isinstance(idx, AnchorIndex) else idx.learnt_counts()["tries"].sum())


def run_case(backend, cfg, history, prompt, extend, budget):
    d = drafter(backend, **cfg)
    if history:
        d.add("p", 0, history, prompt_tokens=prompt)
    d.start("r", "p", prompt)
    if extend:
        d.extend("r", list(extend))
    out = d.draft("r", budget)
    assert out.check() is None and d.check_integrity() is None
    return out


H1 = {"sources": ("history",), "prompt_tail": 1}
CASES = [
    # (name, config, history, prompt, extend, budget, (tokens, parents, probs))
    ("exact", H1, [[5, 6, 7]], [3, 9], (), 3, ([5, 6, 7], [-1, 0, 1], [P1, P2, P3])),
    ("budget-cuts-depth", H1, [[5, 6, 7]], [3, 9], (), 2, ([5, 6], [-1, 0], [P1, P2])),
    # two agreeing anchors: noisy-OR 1 - (1 - r)^2 per depth
    ("agree", H1, [[5, 6], [5, 6]], [3, 9], (), 3, ([5, 6], [-1, 0], [1 - (1 - P1) ** 2, 1 - (1 - P2) ** 2])),
    # a branch: each child has one anchor; a visit's first response ranks first (newest first, docs section 13.1)
    ("branch", H1, [[5, 6], [5, 7]], [3, 9], (), 3, ([5, 6, 7], [-1, 0, 0], [1 - (1 - P1) ** 2, P2, P2])),
    # [4, 5] then a substituted token: the history's continuation after its 6
    (
        "substitution",
        {"sources": ("history",), "prompt_tail": 0},
        [[4, 5, 6, 7, 8]],
        [4, 5, 9],
        (),
        3,
        ([7, 8], [-1, 0], [P1, P2]),
    ),  # fmt: skip
    (
        "self",
        {"sources": ("self",), "prompt_tail": 0},
        None,
        [1, 2, 3, 1, 2],
        (),
        3,
        ([3, 1, 2], [-1, 0, 1], [P1, P2, P3]),
    ),
    # the substitution anchor [1, 6] | 2 -> 0 drafts [9, 6, 2, 5] and its rewritten copy [9, 6, 0, 5]: the value the
    # context computed (0 after 6, not 2) carried over (section 13.1); the original ranks first (kind 1 before 3);
    # the copy's prior rates are COPY_PRIOR times the original's
    (
        "rewritten",
        {"sources": ("history",), "prompt_tail": 0},
        [[1, 6, 2, 9, 6, 2, 5]],
        [1, 6, 0],
        (),
        6,
        (
            [9, 6, 2, 0, 5, 5],
            [-1, 0, 1, 1, 2, 3],
            [1 - (1 - P1) * (1 - C * P1), 1 - (1 - P2) * (1 - C * P2), P3, C * P3, P4, C * P4],
        ),
    ),  # fmt: skip
    ("budget-0", H1, [[5, 6, 7]], [3, 9], (), 0, ([], [], [])),
    ("no-match", H1, [[5, 6, 7]], [3, 9], (4,), 4, ([], [], [])),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,cfg,history,prompt,extend,budget,expected", CASES, ids=[c[0] for c in CASES])
def test_cases(backend, name, cfg, history, prompt, extend, budget, expected):
    out = run_case(backend, cfg, history, prompt, extend, budget)
    assert out.source == ("anchors" if expected[0] else "")
    assert (out.token_ids, out.parents) == (expected[0], expected[1])
    assert out.probs == pytest.approx(expected[2], rel=1e-12)


@pytest.mark.parametrize(
    "length,expected", [(1, 0), (2, 1), (3, 2), (4, 3), (5, 3), (6, 4), (20, 6), (21, 7), (99, 7)]
)
def test_length_class(length, expected):
    assert length_class(length) == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_needs_three_tokens(backend):
    cfg = {"sources": ("global",), "prompt_tail": 0}
    d = drafter(backend, **cfg)
    d.add("other", 0, [[1, 2, 3, 4, 5]], prompt_tokens=[0])
    d.start("two", None, [2, 3])
    d.start("three", None, [1, 2, 3])
    assert len(d.draft("two", 4)) == 0
    assert d.draft("three", 4).token_ids == [4, 5]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("right,above", [(True, True), (False, False)])
def test_rates_are_learnt(backend, right, above):
    """A prompt whose history always continues right (or always wrong) is trusted more (or less) than the prior."""
    d = drafter(backend, sources=("history",), prompt_tail=1)
    hist = [10, 11, 12, 13, 14, 15]
    d.add("p", 0, [hist], prompt_tokens=[9])
    for i in range(30):
        d.start(f"r{i}", "p", [9])
        d.draft(f"r{i}", 4)
        response = hist if right else [20, 21, 22, 23, 24, 25]
        d.extend(f"r{i}", response)  # the tokens generated after a draft teach it
        d.finish(f"r{i}", response)
    d.start("last", "p", [9])
    p0 = d.draft("last", 4).probs[0]
    assert (p0 > P1 + 0.2) if above else (p0 < P1 - 0.2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_learning_waits_for_the_outcome(backend):
    """A draft teaches only once DEPTH_MAX tokens after it are known (or the request ends)."""
    idx = INDEXES[backend](min_match=1, max_match=8, prompt_tail=0, sources=("self",))
    idx.start("r", None, [1, 2, 1])
    idx.draft_batch(["r"], [4])
    idx.extend("r", [2] * (DEPTH_MAX - 1))
    assert tries(idx) == 0
    idx.extend("r", [2])
    assert tries(idx) > 0 and idx.check_integrity() is None
    idx.start("s", None, [1, 2, 1])
    idx.draft_batch(["s"], [4])
    idx.extend("s", [2, 2])
    before = tries(idx)
    idx.remove_request("s")  # the end of a request resolves its drafts with the tokens known
    assert tries(idx) > before and idx.check_integrity() is None


def table(idx, name: str):
    """A learnt table ([NUM_CLASSES, DEPTH_MAX]) of either backend."""
    return getattr(idx, f"_{name}") if isinstance(idx, AnchorIndex) else idx.learnt_counts()[name]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("budget", [1, 4, DEPTH_MAX - 1, DEPTH_MAX, DEPTH_MAX + 8])
def test_learning_stops_at_the_draft_budget(backend, budget):
    """A draft made with budget b learns nothing at depths >= min(b, DEPTH_MAX): they lay beyond its reach, so
    they are neither tries nor misses; below, every depth is a try and the matched ones hits."""
    idx = INDEXES[backend](min_match=1, max_match=8, prompt_tail=1, sources=("history",))
    response = list(range(10, 10 + 2 * DEPTH_MAX))
    idx.set_history("p", [np.asarray([9, *response], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [9])
    assert len(idx.draft_batch(["r"], [budget])[0][0]) == min(budget, DEPTH_MAX)
    idx.extend("r", response[:DEPTH_MAX])  # the history was right at every depth
    reach = min(budget, DEPTH_MAX)
    tried, hit = table(idx, "tries"), table(idx, "hits")
    (cls,) = np.flatnonzero(tried[:, 0])
    assert tried[cls, :reach].tolist() == [1] * reach and hit[cls, :reach].tolist() == [1] * reach
    assert not tried[:, reach:].any() and not hit[:, reach:].any()
    assert idx.check_integrity() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_short_request_tries_only_the_known_depths(backend):
    """A request that ends 3 tokens after a budget-16 draft tries depths 0-2 only."""
    idx = INDEXES[backend](min_match=1, max_match=8, prompt_tail=1, sources=("history",))
    idx.set_history("p", [np.asarray([9, *range(10, 50)], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [9])
    idx.draft_batch(["r"], [16])
    idx.extend("r", [10, 11, 99])
    idx.remove_request("r")
    tried, hit = table(idx, "tries"), table(idx, "hits")
    assert tried.sum(axis=0).tolist() == [1, 1, 1] + [0] * (DEPTH_MAX - 3)
    assert hit.sum(axis=0).tolist() == [1, 1] + [0] * (DEPTH_MAX - 2)


def test_anchor_class_is_a_bijection_on_its_fields():
    seen = {anchor_class(s, k, length, h, e) for s in range(5) for k in range(4) for length in (1, 2, 3, 4, 6, 9, 13, 21)
            for h in range(4) for e in range(12)}  # fmt: skip
    assert len(seen) == NUM_CLASSES == 5 * 4 * 8 * 4 * 12 and min(seen) == 0 and max(seen) == NUM_CLASSES - 1


@pytest.mark.parametrize(
    "seq,j,ctx,reach,expected",
    [
        # the nearest mismatch makes the rule (6, 2) -> 0; "2" after another token is kept
        ([1, 6, 2, 9, 2, 6, 2], 3, [1, 6, 0], 4, (9, 2, 6, 0)),
        # two mismatches in a row: (2, 2) -> 3 and (2, 5) -> 0 turn a later 225 into 230
        ([4, 2, 2, 5, 8, 2, 2, 5], 4, [4, 2, 3, 0], 4, (8, 2, 3, 0)),
        ([4, 2, 2, 5, 8, 2, 2, 5], 4, [4, 2, 3, 0], 2, None),  # within reach nothing changes
        ([4, 5, 6, 7], 3, [4, 5, 6], 2, None),  # no mismatch, no rule
        ([9, 5, 6, 7, 5, 6], 3, [3, 8, 6], 3, None),  # rule (9, 5) -> 8: the continuation's 5 follows 7, not 9
    ],
)
def test_rewritten(seq, j, ctx, reach, expected):
    assert rewritten(seq, j, ctx, len(ctx), reach) == expected


RUNNING = {"sources": ("running",), "prompt_tail": 1}
RUNNING_CASES = [
    # (name, requests as (id, prompt id, emitted tokens), the drafting request, its draft's tokens)
    ("ahead", [("a", "p", [5, 6, 7]), ("b", "p", [])], "b", [5, 6, 7]),
    ("not-itself", [("a", "p", [5, 6, 7]), ("b", "p", [])], "a", []),
    ("newest-started-first", [("a", "p", [5, 6]), ("c", "p", [5, 8]), ("b", "p", [])], "b", [5, 8, 6]),
    ("other-prompt", [("a", "q", [5, 6, 7]), ("b", "p", [])], "b", []),
    ("no-prompt-id", [("a", None, [5, 6, 7]), ("b", None, [])], "b", []),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,requests,who,expected", RUNNING_CASES, ids=[c[0] for c in RUNNING_CASES])
def test_running_siblings(backend, name, requests, who, expected):
    """A request drafts what its prompt's other running requests emitted after its context's suffix (prompt tail
    [9] here), never from itself, another prompt's requests or requests without a prompt id."""
    d = drafter(backend, **RUNNING)
    for req_id, prompt_id, emitted in requests:
        d.start(req_id, prompt_id, [3, 9])
        d.extend(req_id, emitted)
    out = d.draft(who, 4)
    assert out.token_ids == expected and d.check_integrity() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_finished_request_is_no_longer_running(backend):
    d = drafter(backend, **RUNNING)
    for req_id in ("a", "b"):
        d.start(req_id, "p", [3, 9])
    d.extend("a", [5, 6])
    assert d.draft("b", 4).token_ids == [5, 6]
    d.finish("a", [5, 6])  # a sibling now: drafted by the siblings source only
    assert len(d.draft("b", 4)) == 0 and d.check_integrity() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_snapshots_keep_no_running_request(backend, tmp_path):
    d = drafter(backend, **RUNNING)
    for req_id in ("a", "b"):
        d.start(req_id, "p", [3, 9])
    d.extend("a", [5, 6])
    d.snapshot(tmp_path / "s.snap")
    loaded = HistoSpecDrafter.load(tmp_path / "s.snap", DrafterConfig(scorer="anchors", backend=backend, **RUNNING))
    assert loaded.active_requests() == set() and loaded.check_integrity() is None
    loaded.start("b", "p", [3, 9])
    assert len(loaded.draft("b", 4)) == 0  # "a" ran in the snapshotted drafter only
    assert d.draft("b", 4).token_ids == [5, 6]


def test_running_belongs_to_the_anchors_scorer():
    assert DrafterConfig().sources == SOURCES and "running" in SOURCES
    assert DrafterConfig(scorer="counts").sources == COUNTS_SOURCES
    with pytest.raises(ValueError, match="counts scorer has no 'running' source"):
        DrafterConfig(scorer="counts", sources=("history", "running"))
    for cls in (ReferenceIndex, *([NativeIndex] if NativeIndex else [])):
        with pytest.raises(ValueError, match="source 'running': the counts scorer drafts from a subset"):
            cls(min_match=1, max_match=4, tree=True, min_prob=0.1, use_frequency=True, sources=("running",))


def test_bad_scorer_names_the_choices():
    with pytest.raises(ValueError, match="scorer='bogus'.*'counts' or 'anchors'"):
        DrafterConfig(scorer="bogus")
    with pytest.raises(ValueError, match="chain mode belongs to the counts scorer; set scorer='counts'"):
        DrafterConfig(tree=False)
    assert DrafterConfig(tree=False, scorer="counts").scorer == "counts"


def _occurs(path, seqs, carried=()) -> bool:
    """``path`` is a run of some sequence, up to tokens in ``carried`` (a rewritten copy's, section 13.1)."""
    n = len(path)
    return any(
        all(a == b or a in carried for a, b in zip(path, s[i : i + n])) for s in seqs for i in range(len(s) - n + 1)
    )


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=120, deadline=None)
@given(
    history=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=14), min_size=0, max_size=5),
    siblings=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=14), max_size=3),
    prompt=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    steps=st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(0, 4), max_size=4)), max_size=8),
    tail=st.integers(0, 2),
)
def test_draft_invariants(backend, history, siblings, prompt, steps, tail):
    """Drafts are well-formed trees within the budget, probabilities in (0, 1] never grow from parent to child,
    and every drafted path is a run of tokens of some source or of the context, but for tokens carried over from
    the context's last ``HAM_WINDOW`` (rewritten copies)."""
    d = drafter(backend, prompt_tail=tail, max_match=6)
    if history:
        d.add("p", 0, history, prompt_tokens=prompt)
    for i, s in enumerate(siblings):
        d.start(f"s{i}", "p", prompt)
        d.finish(f"s{i}", s)
    d.start("r", "p", prompt)
    ctx = list(prompt)
    head = prompt[len(prompt) - tail :] if tail else []
    seqs = [head + h for h in history] + [head + s for s in siblings]
    for budget, toks in steps:
        out = d.draft("r", budget)
        assert out.check() is None and len(out) <= budget
        for i, (p, q) in enumerate(zip(out.parents, out.probs)):
            assert 0.0 < q <= 1.0 and (p < 0 or q <= out.probs[p])
            assert _occurs(out.path(i), seqs + [ctx], carried=set(ctx[-HAM_WINDOW:]))
        d.extend("r", toks)
        ctx += toks
        assert d.check_integrity() is None
    d.finish("r", ctx[len(prompt) :])
    assert d.check_integrity() is None


@pytest.mark.parametrize(
    "args,expected",
    [
        ((1, 0.9, 0.6, 3, 3, [3, 0, 0, 0, 3, 0, 0]), (0, 10, 6, 2, 5, 3, 0, 0, 0, 2, 0, 0)),
        ((2, 0.3, 0.3, 1, 4, [0, 1, 1, 0, 0, 1, 0]), (1, 3, 3, 0, 1, 0, 1, 2, 0, 0, 2, 0)),
        ((21, 0.995, 0.99, 17, 48, [7, 3, 5, 6, 9, 0, 17]), (7, 14, 13, 5, 1, 7, 3, 0, 1, 1, 0, 2)),
    ],
)
def test_node_features(args, expected):
    """Depth, raw and best classes, count class, share of the parent's anchors, longest match, best agreement,
    and the thirds of substitutions, copies, history, self and running anchors (docs/drafting.md section 13.3)."""
    assert node_features(*args) == expected


def test_reranker_step_follows_the_rule():
    """One step of the re-ranker on two known nodes, by hand (docs/drafting.md section 13.4): errors under the
    untrained weights (bias 0, slope 1, classes 0), each node's classes moved by RERANK_LR x its error, the bias by
    RERANK_LR x the mean error and the slope by RERANK_LR x the mean of error x raw logit."""
    idx = AnchorIndex(min_match=1, max_match=8, prompt_tail=1, sources=("history",))
    f1, f2 = (0, 10, 6, 2, 5, 3, 0, 0, 0, 2, 0, 0), (1, 3, 3, 0, 1, 0, 1, 2, 0, 0, 2, 0)
    raws = [1.0, 1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(1.0))]  # raw logits 0.5 and -1 (to rounding)
    p = _Pending(0, 2, [], [{}, {}, {}], [0, 1, 2], [(), f1, f2], raws)
    idx._learn_nodes(p, [1, 2], {1})
    e1, e2 = 1 - 1 / (1 + math.exp(-0.5)), -1 / (1 + math.exp(1.0))
    expected = [0.0] * NUM_WEIGHTS
    for f, e in ((f1, e1), (f2, e2)):
        for k, c in enumerate(f):
            expected[sum(FEATURE_SIZES[:k]) + c] += RERANK_LR * e
    expected[-2] = RERANK_LR * (e1 + e2) / 2
    expected[-1] = 1.0 + RERANK_LR * (e1 * 0.5 - e2) / 2
    assert idx._weights == pytest.approx(expected, abs=1e-15)
