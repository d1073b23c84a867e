"""FlatDrafts: a step's drafts as flat arrays (the docstring's example, limits, the invariant checker)."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_histospec.drafting import ROOT, Draft
from sglang_histospec.drafting.flat import FlatDrafts

A = Draft([5, 7, 6], [ROOT, ROOT, 0], [0.6, 0.4, 0.6])
B = Draft([3], [ROOT], [0.9])


@pytest.mark.parametrize(
    "limits, tokens, parents, owner, sizes",
    [
        ([2, 4], [5, 7, 3], [-1, -1, -1], [0, 0, 1], [2, 1]),  # the docstring's example
        (None, [5, 7, 6, 3], [-1, -1, 0, -1], [0, 0, 0, 1], [3, 1]),  # whole drafts; parents become flat indices
        ([0, 1], [3], [-1], [1], [0, 1]),  # a draft cut to nothing
    ],
)
def test_flat_arrays(limits, tokens, parents, owner, sizes):
    f = FlatDrafts.of([A, B], limits)
    assert f.check() is None and len(f) == len(tokens)
    assert (f.tokens.tolist(), f.parents.tolist(), f.owner.tolist(), f.sizes.tolist()) == (
        tokens,
        parents,
        owner,
        sizes,
    )


def test_conditional_probabilities_and_empty_steps():
    f = FlatDrafts.of([A])
    assert np.allclose(f.cond(), [0.6, 0.4, 1.0])  # node 2: 0.6 / its parent's 0.6
    empty = FlatDrafts.of([Draft.empty(), Draft.empty()])
    assert len(empty) == 0 and empty.check() is None and empty.starts.tolist() == [0, 0]
    assert len(FlatDrafts.of([])) == 0


def test_bad_input_and_broken_invariants():
    with pytest.raises(ValueError, match="limits"):
        FlatDrafts.of([A, B], [1])
    f = FlatDrafts.of([A, B])
    f.parents[3] = 0  # draft 1's node points into draft 0
    assert "another draft" in f.check()


def test_along_paths_combines_each_node_with_its_ancestors():
    chain_ = FlatDrafts.of([Draft([1, 2, 3], [ROOT, 0, 1], [1.0, 1.0, 1.0]), B])
    got = chain_.along_paths(np.array([0.5, 0.5, 0.5, 0.9]), np.multiply)
    assert np.allclose(got, [0.5, 0.25, 0.125, 0.9])  # the docstring's example, then draft 1's root child
    assert chain_.along_paths(np.array([True, False, True, True]), np.logical_and).tolist() == [
        True,
        False,
        False,
        True,
    ]
