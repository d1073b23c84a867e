"""One verify step's draft trees, flattened: the forward inputs of every tree node and the batched verify walk.

Each running request contributes its root (the last committed token) plus its draft nodes; ``TreeBatch`` numbers
all nodes of all trees in one row space. Example::

    tb = TreeBatch.build([([5, 7, 8, 3], [-1, 0, 0, 1]), None], root_tokens=[5, 9])
    tb.offsets              # [0, 4, 5]: request 0 owns rows 0-3, request 1 row 4
    tb.depth                # [0, 1, 1, 2, 0]
    tb.pairs                # (row, key) pairs: key is the row or an ancestor (the tree attention mask)
    tb.walk(np.array([7, 3, 1, 6, 4]))   # drawn token at every row
    # request 0: root drew 7 -> node 1, node 1 drew 3 -> node 3, node 3 drew 6 (no child): emits [7, 3, 6]
    # request 1: the root alone emits [4]
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np


@dataclass(slots=True)
class WalkResult:
    """The verify walk of one request (``TreeBatch.walk``)."""

    accepted_nodes: list[int]
    """Accepted draft nodes (indices into the request's tree, root = 0), in path order."""
    tokens: list[int]
    """Emitted tokens: the accepted draft tokens, then the final token drawn at the last visited node."""
    rows: list[int]
    """Global rows of the visited nodes (the distribution each emitted token was drawn from)."""


@dataclass(slots=True)
class TreeBatch:
    """The flattened trees of one verify step (build with ``TreeBatch.build``; ``check`` names a broken invariant).

    Row r belongs to request ``owner[r]`` as its node ``local[r]``; rows of one request are contiguous, its root
    first, every parent before its children: request 0's root, its nodes, request 1's root, ... (the order of the
    verify pass's logits). The per-node work runs with numpy over all rows at once instead of a Python loop per
    request: depths (rotary positions), ancestor masks (who may attend to whom), and, after the forward, the walk
    that follows each tree's accepted children (``walk``).
    """

    counts: np.ndarray  # [B] int64 nodes per request, root included
    offsets: np.ndarray  # [B + 1] int64 first row of each request; offsets[-1] = R
    tokens: np.ndarray  # [R] int64 token of every row (roots included)
    parent: np.ndarray  # [R] int64 global row of the parent; -1 for roots
    depth: np.ndarray  # [R] int64 depth below the request's root (root = 0)
    local: np.ndarray  # [R] int64 node index within its tree (root = 0)
    owner: np.ndarray  # [R] int64 request of every row
    pairs: tuple[np.ndarray, np.ndarray]  # ([P], [P]) int64 (row, key row): the key is the row or an ancestor

    @classmethod
    def build(cls, trees: list[tuple[list[int], list[int]] | None], root_tokens: list[int]) -> TreeBatch:
        """Flatten per-request trees ``(tokens, parents)`` (node 0 = root, ``parents[0] = -1``, parents before
        children) or None (the root alone); ``root_tokens[b]`` replaces each tree's root token."""
        if len(trees) != len(root_tokens):
            raise ValueError(f"{len(trees)} trees but {len(root_tokens)} root tokens: pass one of each per request")
        grown = [(b, t) for b, t in enumerate(trees) if t is not None and len(t[0]) > 1]
        owner = np.fromiter(chain.from_iterable([b] * (len(t[0]) - 1) for b, t in grown), dtype=np.int64)
        tokens = np.fromiter(chain.from_iterable(t[0][1:] for _, t in grown), dtype=np.int64, count=len(owner))
        parents = np.fromiter(chain.from_iterable(t[1][1:] for _, t in grown), dtype=np.int64, count=len(owner))
        return cls.from_nodes(root_tokens, owner, tokens, parents)

    @classmethod
    def from_nodes(
        cls,
        root_tokens: list[int],
        owner: np.ndarray,  # [N] int64 request of every draft node, non-decreasing
        tokens: np.ndarray,  # [N] int64 token of every draft node
        parents: np.ndarray,  # [N] int64 parent within the request's tree: 0 = its root, j = its j-th node
    ) -> TreeBatch:
        """The batch of ``len(root_tokens)`` requests whose draft nodes are given flat, each request's in tree order
        (node j of request b is the j-th node with owner b, numbered from 1; parents before children)."""
        bsz = len(root_tokens)
        counts = 1 + np.bincount(owner, minlength=bsz).astype(np.int64)
        offsets = np.zeros(bsz + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        rows = int(offsets[-1])
        row_owner = np.repeat(np.arange(bsz, dtype=np.int64), counts)
        local = np.arange(rows, dtype=np.int64) - offsets[row_owner]
        roots = offsets[:-1]
        all_tokens = np.empty(rows, dtype=np.int64)
        all_tokens[roots] = np.asarray(root_tokens, dtype=np.int64).reshape(-1)
        if rows == bsz:  # no request has a draft
            minus = np.full(rows, -1, dtype=np.int64)
            ident = np.arange(rows, dtype=np.int64)
            return cls(
                counts, offsets, all_tokens, minus, np.zeros(rows, dtype=np.int64), local, row_owner, (ident, ident)
            )
        nodes = np.flatnonzero(local > 0)  # rows of the draft nodes, in the given order
        all_tokens[nodes] = tokens
        parent = np.full(rows, -1, dtype=np.int64)
        parent[nodes] = offsets[owner] + parents
        pair_rows, pair_keys = _ancestor_pairs(parent)
        depth = np.bincount(pair_rows, minlength=rows) - 1  # proper ancestors of each row
        return cls(counts, offsets, all_tokens, parent, depth, local, row_owner, (pair_rows, pair_keys))

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def check(self) -> str | None:
        """Return a description of the first broken invariant, or None when the batch is well formed."""
        rows = self.num_rows
        if self.offsets[0] != 0 or (np.diff(self.offsets) != self.counts).any() or (self.counts < 1).any():
            return f"offsets {self.offsets.tolist()} do not match counts {self.counts.tolist()} (each >= 1)"
        for name in ("tokens", "parent", "depth", "local", "owner"):
            if len(getattr(self, name)) != rows:
                return f"{name} has {len(getattr(self, name))} rows, expected {rows}"
        roots = self.offsets[:-1]
        if (self.parent[roots] != -1).any() or (self.depth[roots] != 0).any() or (self.local[roots] != 0).any():
            return "a request's first row is not a root (parent -1, depth 0, local 0)"
        child = np.flatnonzero(self.parent >= 0)
        par = self.parent[child]
        if (par >= child).any() or (self.owner[par] != self.owner[child]).any():
            return "a parent comes after its child or belongs to another request"
        if (self.depth[child] != self.depth[par] + 1).any():
            return "a child's depth is not its parent's plus one"
        if len(self.parent) - len(child) != len(self.counts):
            return f"{len(self.parent) - len(child)} roots for {len(self.counts)} requests"
        return None

    def walk(self, picked: np.ndarray) -> list[WalkResult]:
        """Follow, in every tree at once, the child whose token equals the token drawn at the current node.

        ``picked`` [R] int64 is the token drawn (or the argmax) at every row. A node with several children of the
        same token only ever moves to the first of them (as the sequential rule, which zeroes a rejected token).
        """
        drawn = picked.tolist()
        has = np.flatnonzero(self.parent >= 0)
        table: dict[int, int] = {}
        width = 0
        if len(has):
            width = int(max(self.tokens.max(), picked.max())) + 1
            keys = (self.parent[has] * width + self.tokens[has]).tolist()
            table = dict(zip(keys[::-1], has[::-1].tolist()))  # (parent, token) -> child; the first one wins
        out = []
        for off in self.offsets[:-1].tolist():
            row, path, tokens = off, [off], []
            while True:
                x = drawn[row]
                tokens.append(x)
                row = table.get(row * width + x, -1)
                if row < 0:
                    break
                path.append(row)
            out.append(WalkResult([r - off for r in path[1:]], tokens, path))
        return out


def _ancestor_pairs(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, key row) pair where the key row is the row itself or one of its ancestors (``parent`` [R] int64,
    -1 for roots). Example: a chain root -> a -> b gives (0, 0), (1, 1), (2, 2), (1, 0), (2, 1), (2, 0)."""
    rows = [np.arange(len(parent), dtype=np.int64)]
    keys = [rows[0]]
    cur_rows, cur_keys = rows[0], parent
    while True:  # climb one level per round from every row at once
        keep = cur_keys >= 0
        cur_rows, cur_keys = cur_rows[keep], cur_keys[keep]
        if not len(cur_rows):
            break
        rows.append(cur_rows)
        keys.append(cur_keys)
        cur_keys = parent[cur_keys]
    return np.concatenate(rows), np.concatenate(keys)
