"""TreeBatch (the flattened draft trees of one verify step) against a per-request Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.engine.treebatch import TreeBatch


def _ref_depths(parents):
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def _ref_ancestors(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def _ref_walk(picked, tokens, parents):
    """Per-request walk: from the root, move to the first child carrying the drawn token."""
    node, accepted, emitted = 0, [], []
    while True:
        x = int(picked[node])
        emitted.append(x)
        node = next((c for c in range(1, len(tokens)) if parents[c] == node and tokens[c] == x), None)
        if node is None:
            return accepted, emitted
        accepted.append(node)


def test_docstring_example():
    tb = TreeBatch.build([([5, 7, 8, 3], [-1, 0, 0, 1]), None], root_tokens=[5, 9])
    assert tb.offsets.tolist() == [0, 4, 5]
    assert tb.depth.tolist() == [0, 1, 1, 2, 0]
    a, b = tb.walk(np.array([7, 3, 1, 6, 4]))
    assert (a.accepted_nodes, a.tokens, a.rows) == ([1, 3], [7, 3, 6], [0, 1, 3])
    assert (b.accepted_nodes, b.tokens, b.rows) == ([], [4], [4])


@pytest.mark.parametrize(
    "trees, roots, picked, accepted, emitted",
    [
        ([None, None], [1, 2], [3, 4], [[], []], [[3], [4]]),  # no drafts at all
        ([([0, 4, 4, 6], [-1, 0, 0, 2])], [9], [4, 1, 1, 1], [[1]], [[4, 1]]),  # duplicates: the first one only
        ([([0, 4, 5], [-1, 0, 1])], [9], [4, 5, 2], [[1, 2]], [[4, 5, 2]]),  # a chain fully accepted
        ([([0, 4], [-1, 0]), ([0, 8], [-1, 0])], [1, 2], [3, 0, 8, 7], [[], [1]], [[3], [8, 7]]),
    ],
)
def test_walk_table(trees, roots, picked, accepted, emitted):
    walks = TreeBatch.build(trees, roots).walk(np.array(picked))
    assert [w.accepted_nodes for w in walks] == accepted
    assert [w.tokens for w in walks] == emitted


def test_build_rejects_mismatched_roots():
    with pytest.raises(ValueError, match="root tokens"):
        TreeBatch.build([None, None], [1])


@st.composite
def _batch(draw):
    vocab = draw(st.integers(2, 6))
    trees, roots, picks = [], [], []
    for _ in range(draw(st.integers(1, 5))):
        roots.append(draw(st.integers(0, vocab - 1)))
        n = draw(st.integers(0, 9))
        if n == 0 and draw(st.booleans()):
            trees.append(None)
            picks.append([draw(st.integers(0, vocab - 1))])
            continue
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n + 1)]
        tokens = [0] + [draw(st.integers(0, vocab - 1)) for _ in range(n)]  # duplicates among siblings allowed
        trees.append((tokens, parents))
        picks.append([draw(st.integers(0, vocab - 1)) for _ in range(n + 1)])
    return trees, roots, picks


@settings(max_examples=300, deadline=None)
@given(_batch())
def test_matches_reference(batch):
    trees, roots, picks = batch
    tb = TreeBatch.build(trees, roots)
    assert tb.check() is None
    walks = tb.walk(np.array([x for p in picks for x in p], dtype=np.int64))
    pairs = set(zip(*(a.tolist() for a in tb.pairs)))
    for b, (tree, root, pick) in enumerate(zip(trees, roots, picks)):
        tokens, parents = tree if tree is not None else ([root], [-1])
        lo, hi = int(tb.offsets[b]), int(tb.offsets[b + 1])
        assert hi - lo == len(tokens)
        assert tb.tokens[lo:hi].tolist() == [root, *tokens[1:]]
        assert tb.depth[lo:hi].tolist() == _ref_depths(parents)
        assert tb.local[lo:hi].tolist() == list(range(len(tokens)))
        assert (tb.owner[lo:hi] == b).all()
        for i in range(len(tokens)):
            got = {k - lo for (r, k) in pairs if r == lo + i}
            assert got == _ref_ancestors(parents, i)
        accepted, emitted = _ref_walk(pick, tokens, parents)
        assert walks[b].accepted_nodes == accepted
        assert walks[b].tokens == emitted
        assert walks[b].rows == [lo] + [lo + a for a in accepted]


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("depth", [0, 1, 2, 2, 0], "depth"),
        ("parent", [-1, 0, 0, 1, 0], "not a root"),
        ("parent", [-1, 2, 0, 1, -1], "after its child"),
        ("counts", [3, 2], "offsets"),
    ],
)
def test_check_names_the_broken_invariant(field, value, match):
    tb = TreeBatch.build([([5, 7, 8, 3], [-1, 0, 0, 1]), None], root_tokens=[5, 9])
    assert tb.check() is None
    setattr(tb, field, np.array(value, dtype=np.int64))
    assert match in tb.check()
