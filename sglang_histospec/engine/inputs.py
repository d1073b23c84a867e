"""The forward inputs of one pass, for a prefill and for a verify step alike: ids, positions, cache writes, mask.

Layout rules: :func:`build_inputs`. Example (one request with kv = 2 cached tokens, pre = 1 to prefill, a root and
two children)::

    tb = TreeBatch.build([([0, 7, 8], [-1, 0, 0])], root_tokens=[9])
    x = build_inputs([[1, 3, 4, 9]], kv=np.array([2]), pre=np.array([1]), tb=tb)
    x.ids, x.pos, x.write   # [[4, 9, 7, 8]], [[2, 3, 4, 4]], [[2, 3, 4, 5]]
    x.mask    # keys 0-5:  [1 1 1 0 0 0]   the prefill token 4 sees the past and itself
              #            [1 1 1 1 0 0]   the root 9 sees the past and itself
              #            [1 1 1 1 1 0]   node 1 (7) sees the root and itself
              #            [1 1 1 1 0 1]   node 2 (8) sees the root and itself, not its sibling
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_histospec.engine.treebatch import TreeBatch


@dataclass(slots=True)
class StepInputs:
    """The host arrays of one forward pass (``TreeForward.forward`` takes them as tensors)."""

    ids: np.ndarray  # [B, N] int64 token of every query column (0 = padding)
    pos: np.ndarray  # [B, N] int64 rotary position
    write: np.ndarray  # [B, N] int64 cache index the column's K/V is written to; -1 = padding (not written)
    mask: np.ndarray  # [B, N, T] bool, True = the column may attend to cached key t
    pre: np.ndarray  # [B] int64 prefill columns of each row (they come first)
    counts: np.ndarray  # [B] int64 tree columns of each row (root included; 0 in a prefill pass)
    base: np.ndarray  # [B] int64 cache index of each row's root: kv + pre

    @property
    def num_keys(self) -> int:
        """T: cached keys the pass reads (indices 0..T-1)."""
        return self.mask.shape[2]

    def tree_cols(self) -> np.ndarray:  # [B, N] bool
        """The root and draft columns; selected from the output they give the [R, H] rows of ``TreeBatch`` order."""
        col = np.arange(self.ids.shape[1])[None, :]
        return (col >= self.pre[:, None]) & (col < (self.pre + self.counts)[:, None])


def build_inputs(
    tokens: list[list[int]],  # [B] each row's tokens; tokens[b][kv[b] : kv[b] + pre[b]] are prefilled
    kv: np.ndarray,  # [B] int64 tokens with K/V already cached
    pre: np.ndarray,  # [B] int64 tokens to prefill in this pass
    tb: TreeBatch | None = None,  # the verify step's trees (one per row); None = a prefill pass
) -> StepInputs:
    """Lay out one pass (the module docstring has an example); a prefill pass needs ``pre.max() >= 1``.

    Row b of a pass is one request. Its query columns hold, in order: ``pre[b]`` tokens whose K/V is not cached yet
    (``tokens[kv : kv + pre]``, causal), then, in a verify step, its tree (the root, the last token, then the draft
    nodes of ``TreeBatch``), then padding. ``base = kv + pre`` is the cache index of the root. A prefill column sits
    at its own position; tree node i sits at position ``base + depth(i)``, is written to cache index ``base + i`` and
    sees the past and its ancestors. Padding is never written: in a prefill pass it sits at position 0 and sees key
    0, in a verify step at the root's position and sees the past and the root."""
    counts = np.zeros_like(pre) if tb is None else tb.counts
    base = kv + pre
    bsz, n, t = len(pre), int((pre + counts).max()), int((base + counts).max())
    ids = np.zeros((bsz, n), dtype=np.int64)
    write = np.full((bsz, n), -1, dtype=np.int64)
    if tb is None:  # padding sits at position 0 and sees key 0
        pos = np.zeros((bsz, n), dtype=np.int64)
        mask = np.zeros((bsz, n, t), dtype=bool)
        mask[:, :, 0] = True
    else:  # padding sits at the root's position and sees the past and the root
        pos = np.repeat(base[:, None], n, axis=1)
        mask = np.broadcast_to(np.arange(t)[None, None, :] < base[:, None, None], (bsz, n, t)).copy()
        mask[np.arange(bsz), :, base] = True
    keys = np.arange(t)
    for b in np.flatnonzero(pre):
        k, m = int(kv[b]), int(pre[b])
        ids[b, :m] = tokens[b][k : k + m]
        pos[b, :m] = np.arange(k, k + m)
        write[b, :m] = pos[b, :m]
        mask[b, :m] = keys[None, :] <= pos[b, :m, None]  # causal: the past and the chunk up to itself, not the root
    if tb is not None:
        _place_trees(tb, pre, base, ids, pos, write, mask)
    return StepInputs(ids, pos, write, mask, pre, counts, base)


def _place_trees(tb: TreeBatch, pre, base, ids, pos, write, mask) -> None:
    """Write every tree node at once: node i of request b sits at query column pre[b] + i, is written to cache
    index base[b] + i, has rotary position base[b] + depth(i) and sees its ancestors (and itself) among the tree
    keys (the past and the root are already visible)."""
    owner, local = tb.owner, tb.local
    qcol, at = pre[owner] + local, base[owner]
    ids[owner, qcol] = tb.tokens
    pos[owner, qcol] = at + tb.depth
    write[owner, qcol] = at + local
    if tb.num_rows > len(pre):
        r, k = tb.pairs
        mask[owner[r], qcol[r], at[r] + local[k]] = True
