"""pack_draft: SGLang NGRAM's fixed-size tree layout."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_histospec.drafting import ROOT, Draft, pack_draft

TREE = Draft([5, 7, 6], [ROOT, ROOT, 0], [0.6, 0.4, 0.6])


@pytest.mark.parametrize(
    "draft, n, tokens, parents, num_real",
    [
        (TREE, 5, [9, 5, 7, 6, 0], [-1, 0, 0, 1, 0], 4),
        (TREE, 4, [9, 5, 7, 6], [-1, 0, 0, 1], 4),
        (TREE, 3, [9, 5, 7], [-1, 0, 0], 3),  # truncated to a BFS prefix
        (Draft.empty(), 3, [9, 0, 0], [-1, 0, 0], 1),
        (TREE, 1, [9], [-1], 1),
    ],
)
def test_layout(draft, n, tokens, parents, num_real):
    p = pack_draft(draft, root_token=9, num_nodes=n)
    assert p.tokens.dtype == np.int64 and p.parents.dtype == np.int64 and p.mask.dtype == bool
    assert p.tokens.tolist() == tokens and p.parents.tolist() == parents and p.num_real == num_real
    assert p.mask.shape == (n, n)
    for i in range(n):  # mask[i, j] iff j is an ancestor of i or i itself
        anc = {i}
        j = i
        while p.parents[j] >= 0:
            j = int(p.parents[j])
            anc.add(j)
        assert set(np.flatnonzero(p.mask[i]).tolist()) == anc


def test_mask_of_chain():
    p = pack_draft(Draft([1, 2, 3], [ROOT, 0, 1], [1.0, 1.0, 1.0]), root_token=4, num_nodes=4)
    assert (p.mask == np.tril(np.ones((4, 4), dtype=bool))).all()


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"root_token": -1, "num_nodes": 4}, "root_token"),
        ({"root_token": 1, "num_nodes": 0}, "num_nodes"),
        ({"root_token": 1, "num_nodes": 2.0}, "num_nodes"),
    ],
)
def test_bad_input(kw, message):
    with pytest.raises(ValueError, match=message):
        pack_draft(TREE, **kw)


def test_malformed_draft():
    with pytest.raises(ValueError, match="malformed"):
        pack_draft(Draft([1, 2], [ROOT, 1], [1.0, 1.0]), root_token=0, num_nodes=4)
