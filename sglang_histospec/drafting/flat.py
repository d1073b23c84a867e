"""The drafts of one step as flat arrays (``FlatDrafts``): what the cost cut, the packing and the calibration read.

A verify step drafts for every running request; each draft is a small tree (``Draft``, lists in BFS order). Work per
node (calibrating, cutting, packing, learning) is done with numpy over all nodes of the step at once, on the first
``limits[i]`` nodes of draft i, concatenated. Example::

    f = FlatDrafts.of([Draft([5, 7, 6], [ROOT, ROOT, 0], [0.6, 0.4, 0.6]), Draft([3], [ROOT], [0.9])], [2, 4])
    f.tokens, f.parents, f.owner     # [5, 7, 3], [-1, -1, -1], [0, 0, 1]: draft 0 cut to its first 2 nodes
    f.sizes, f.starts                # [2, 1], [0, 2]
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from sglang_histospec.drafting.types import Draft


@dataclass(slots=True)
class FlatDrafts:
    """BFS prefixes of a step's drafts, concatenated in draft order (build with ``FlatDrafts.of``)."""

    drafts: list[Draft]
    """The drafts (their ``source`` and ``match_len`` apply to all their nodes)."""
    sizes: np.ndarray  # [D] int64 nodes of each draft in the flat arrays
    starts: np.ndarray  # [D] int64 flat index of each draft's first node
    tokens: np.ndarray  # [n] int64 token of every node
    parents: np.ndarray  # [n] int64 flat index of every node's parent; -1 for children of the root
    probs: np.ndarray  # [n] float64 path probability of every node
    owner: np.ndarray  # [n] int64 draft of every node

    @classmethod
    def of(cls, drafts: list[Draft], limits: list[int] | None = None) -> FlatDrafts:
        """The first ``limits[i]`` nodes (default all) of every draft."""
        if limits is not None and len(limits) != len(drafts):
            raise ValueError(f"{len(drafts)} drafts but {len(limits)} limits: pass one limit per draft")
        lens = [len(d) for d in drafts]
        sizes = lens if limits is None else [min(n, max(int(k), 0)) for n, k in zip(lens, limits)]
        total = sum(sizes)
        size_arr = np.asarray(sizes, dtype=np.int64).reshape(-1)
        starts = np.zeros(len(drafts), dtype=np.int64)
        if len(drafts) > 1:
            np.cumsum(size_arr[:-1], out=starts[1:])
        cut = [(d, k) for d, k in zip(drafts, sizes) if k]

        def gather(field: str, dtype) -> np.ndarray:
            parts = (getattr(d, field) if k == len(d) else getattr(d, field)[:k] for d, k in cut)
            return np.fromiter(chain.from_iterable(parts), dtype=dtype, count=total)

        owner = np.repeat(np.arange(len(drafts), dtype=np.int64), size_arr)
        local = gather("parents", np.int64)
        parents = np.where(local >= 0, local + starts[owner], -1)
        return cls(
            list(drafts), size_arr, starts, gather("token_ids", np.int64), parents, gather("probs", np.float64), owner
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def cond(self) -> np.ndarray:  # [n] float64
        """Each node's conditional probability: its path probability over its parent's (at most 1)."""
        above = np.where(self.parents >= 0, self.probs[np.maximum(self.parents, 0)], 1.0)
        return np.minimum(self.probs / np.maximum(above, 1e-12), 1.0)

    def along_paths(self, values: np.ndarray, combine: np.ufunc) -> np.ndarray:  # [n] -> [n]
        """``combine`` (a numpy ufunc such as ``np.multiply`` or ``np.logical_and``) of every node's value and its
        ancestors' values ([n] ``values``), by pointer jumping (log2(depth) vector steps). Example: with parents
        ``[-1, 0, 1]`` and ``np.multiply``, ``[0.5, 0.5, 0.5]`` gives ``[0.5, 0.25, 0.125]``."""
        out, up = values, self.parents.copy()
        while (up >= 0).any():  # out[i] combines the 2^k nodes ending at i; up[i] is the node above them
            has = up >= 0
            out = np.where(has, combine(out, out[np.maximum(up, 0)]), out)
            up = np.where(has, up[np.maximum(up, 0)], -1)
        return out

    def check(self) -> str | None:
        """Return a description of the first broken invariant, or None when the arrays are well formed."""
        n = len(self.tokens)
        if not (len(self.parents) == len(self.probs) == len(self.owner) == n == int(self.sizes.sum())):
            return f"{n} tokens, {len(self.parents)} parents, {len(self.probs)} probs, sizes sum {self.sizes.sum()}"
        if len(self.drafts) != len(self.sizes) or (self.sizes > [len(d) for d in self.drafts]).any():
            return "sizes do not match the drafts"
        child = np.flatnonzero(self.parents >= 0)
        if (self.parents[child] >= child).any() or (self.owner[self.parents[child]] != self.owner[child]).any():
            return "a parent comes after its child or belongs to another draft"
        return None


__all__ = ["FlatDrafts"]
