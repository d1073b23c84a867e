"""The input builder (engine/inputs.py): one layout for prefill passes and verify steps, against hand tables."""

from __future__ import annotations

import numpy as np

from sglang_histospec.engine.inputs import build_inputs
from sglang_histospec.engine.treebatch import TreeBatch


def _a(rows):
    return np.array(rows, dtype=np.int64)


def _m(rows):
    return np.array([[[c == "1" for c in row] for row in col] for col in rows])


def test_prefill_batch():
    """Three rows: a fresh 4-token prompt (3 to prefill), a resumed one (2 cached, 2 to prefill), a 1-token prompt
    (nothing to prefill: padding only). Padding sits at position 0, is never written and sees key 0."""
    tokens = [[1, 5, 6, 7], [1, 2, 3, 4, 9], [4]]
    x = build_inputs(tokens, kv=_a([0, 2, 0]), pre=_a([3, 2, 0]))
    assert x.ids.tolist() == [[1, 5, 6], [3, 4, 0], [0, 0, 0]]
    assert x.pos.tolist() == [[0, 1, 2], [2, 3, 0], [0, 0, 0]]
    assert x.write.tolist() == [[0, 1, 2], [2, 3, -1], [-1, -1, -1]]
    assert x.num_keys == 4
    expected = _m(
        [
            ["1000", "1100", "1110"],  # causal over the chunk
            ["1110", "1111", "1000"],  # the cached past, then causal; a padding column
            ["1000", "1000", "1000"],
        ]
    )
    assert (x.mask == expected).all()
    assert x.base.tolist() == [3, 4, 0] and x.counts.tolist() == [0, 0, 0]


def test_verify_batch_with_a_tree():
    """Request 0: 2 cached tokens, 1 merged prefill token, a tree root -> 7 -> 3, root -> 8. Request 1: 3 cached
    tokens and its root alone. Tree node i sits at base + depth(i), is written at base + i, sees its ancestors;
    padding sits at the root's position and sees the past and the root."""
    tb = TreeBatch.build([([0, 7, 8, 3], [-1, 0, 0, 1]), None], root_tokens=[9, 8])
    x = build_inputs([[1, 3, 4, 9], [1, 2, 3, 8]], kv=_a([2, 3]), pre=_a([1, 0]), tb=tb)
    assert x.ids.tolist() == [[4, 9, 7, 8, 3], [8, 0, 0, 0, 0]]
    assert x.pos.tolist() == [[2, 3, 4, 4, 5], [3, 3, 3, 3, 3]]
    assert x.write.tolist() == [[2, 3, 4, 5, 6], [3, -1, -1, -1, -1]]
    assert x.num_keys == 7
    expected = _m(
        [
            [
                "1110000",  # the prefill token 4: the past and itself, not the root
                "1111000",  # the root 9
                "1111100",  # node 1 (7): the root and itself
                "1111010",  # node 2 (8): the root and itself, not its sibling
                "1111101",  # node 3 (3): the root, node 1 and itself
            ],
            ["1111000"] * 5,  # the root alone, then padding: the past and the root
        ]
    )
    assert (x.mask == expected).all()
    assert x.tree_cols().tolist() == [[False, True, True, True, True], [True, False, False, False, False]]
    assert x.ids[x.tree_cols()].tolist() == tb.tokens.tolist()  # the selected columns are TreeBatch's rows


def test_docstring_example():
    tb = TreeBatch.build([([0, 7, 8], [-1, 0, 0])], root_tokens=[9])
    x = build_inputs([[1, 3, 4, 9]], kv=_a([2]), pre=_a([1]), tb=tb)
    assert x.ids.tolist() == [[4, 9, 7, 8]]
    assert x.pos.tolist() == [[2, 3, 4, 4]]
    assert x.write.tolist() == [[2, 3, 4, 5]]
    assert x.mask[0].astype(int).tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ]


def test_merged_prefill_columns_equal_a_prefill_pass():
    """The prefill columns of a verify step are laid out exactly as in a prefill pass of their own."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        bsz = int(rng.integers(1, 5))
        kv = rng.integers(0, 6, size=bsz)
        pre = rng.integers(0, 5, size=bsz)
        pre[0] = max(pre[0], 1)
        tokens = [rng.integers(4, 64, size=int(k + p + 1)).tolist() for k, p in zip(kv, pre)]
        tb = TreeBatch.build([None] * bsz, [t[-1] for t in tokens])
        alone = build_inputs(tokens, kv, pre)
        merged = build_inputs(tokens, kv, pre, tb)
        for b in range(bsz):
            m = int(pre[b])
            t = alone.num_keys
            assert merged.ids[b, :m].tolist() == alone.ids[b, :m].tolist()
            assert merged.pos[b, :m].tolist() == alone.pos[b, :m].tolist()
            assert merged.write[b, :m].tolist() == alone.write[b, :m].tolist()
            assert (merged.mask[b, :m, :t] == alone.mask[b, :m]).all()
            assert not merged.mask[b, :m, t:].any()
