"""Constants, result types and metric formulas shared by every layer (each defined here once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

ROOT = -1
"""Parent index of a node whose parent is the root (the last committed token)."""
MAX_TOKEN_ID = 2**31
"""Token ids are ints in [0, MAX_TOKEN_ID) (int32 in the native index, the traces and the snapshots)."""
WEIGHT_ONE = 65536
"""Integer weight of one response at age 0 without reward bonus (``docs/drafting.md`` section 1)."""
MAX_BUDGET = 1024
"""Largest accepted draft budget (nodes per draft)."""
SOURCES = ("history", "siblings", "self", "global", "running")
"""All draft sources, in tie-breaking priority order (replay's oracle uses the same names); "running" (the tokens of
a prompt's other requests still decoding) belongs to the anchors scorer only."""
COUNTS_SOURCES = ("history", "siblings", "self", "global")
"""The sources of the counts scorer (``DrafterConfig.scorer="counts"``)."""


def tau(tokens: int | float, verify_steps: int | float) -> float:
    """Mean tokens per verify step (accepted draft nodes plus the bonus token); 0.0 before any verify step.

    Example: ``tau(12, 4) == 3.0``, ``tau(0, 0) == 0.0``.
    """
    return tokens / verify_steps if verify_steps else 0.0


def accepted_path(
    token_ids: Sequence[int], parents: Sequence[int], target: Sequence[int], start: int = 0
) -> list[int]:
    """Indices of the draft nodes accepted when the realized tokens from ``start`` on are ``target[start:]``.

    Walks from the root: among the children of the current node (in draft order) the first whose token equals
    the next realized token is accepted. One forward scan suffices because every parent precedes its children.
    Example: draft root->5->6, root->7 (``token_ids=[5, 7, 6], parents=[-1, -1, 0]``) against ``[5, 6, 9]``
    accepts nodes ``[0, 2]``; against ``[7, 6]`` node ``[1]``.
    """
    cur, path, n = ROOT, [], len(target)
    for i in range(len(token_ids)):
        if start + len(path) >= n:
            break
        if parents[i] == cur and token_ids[i] == target[start + len(path)]:
            cur = i
            path.append(i)
    return path


def accepted_length(token_ids: Sequence[int], parents: Sequence[int], target: Sequence[int], start: int = 0) -> int:
    """How many nodes :func:`accepted_path` accepts. Example: 2 and 1 for its two cases."""
    return len(accepted_path(token_ids, parents, target, start))


@dataclass(frozen=True, slots=True)
class Draft:
    """A token tree proposed for one request; "no draft" is the empty draft, never None.

    Nodes are in BFS order: every node's parent comes before it. The root (the last committed token) is
    implicit and has index ``ROOT`` (-1).

    Example: the tree  root -> 5 -> 6  and  root -> 7  is
    ``Draft(token_ids=[5, 7, 6], parents=[-1, -1, 0], probs=[0.6, 0.4, 0.6])``;
    ``draft.depths() == [1, 1, 2]`` and ``draft.path(2) == [5, 6]``.
    """

    token_ids: list[int] = field(default_factory=list)  # [n] token of each node
    parents: list[int] = field(default_factory=list)  # [n] parent index, ROOT for children of the root
    probs: list[float] = field(default_factory=list)  # [n] path probability of each node, in (0, 1]
    match_len: int = 0
    """Length of the context suffix that the draft was matched on (0 when nothing matched)."""
    source: str = ""
    """Where the nodes came from: "history", "siblings", "self", "global", "mixed" (counts scorer), "anchors" (anchors
    scorer) or "" (empty draft)."""

    @classmethod
    def empty(cls) -> Draft:
        return cls()

    def __len__(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Depth of each node; children of the root have depth 1."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return out

    def path(self, i: int) -> list[int]:
        """Tokens from the root's first child down to node ``i``."""
        toks: list[int] = []
        while i != ROOT:
            toks.append(self.token_ids[i])
            i = self.parents[i]
        return toks[::-1]

    def check(self) -> str | None:
        """Return a description of the first broken invariant, or None when the draft is well formed."""
        n = len(self.token_ids)
        if len(self.parents) != n or len(self.probs) != n:
            return f"length mismatch: {n} tokens, {len(self.parents)} parents, {len(self.probs)} probs"
        for i, p in enumerate(self.parents):
            if not (p == ROOT or 0 <= p < i):
                return f"node {i} has parent {p}, which is not ROOT and not an earlier node"
        depths = self.depths()
        if any(depths[i] > depths[i + 1] for i in range(n - 1)):
            return f"nodes are not in BFS order: depths {depths}"
        if n and self.match_len < 0:
            return f"match_len {self.match_len} < 0"
        return None


class AcceptanceRates:
    """``tau`` and ``accept_rate`` for a result class with ``tokens``, ``verify_steps``, ``drafted`` and
    ``accepted`` counts (a mixin: it adds no fields, so dataclasses with ``slots=True`` can use it).

    Example: 12 tokens in 4 verify steps with 10 drafted and 8 accepted nodes give ``tau == 3.0`` and
    ``accept_rate == 0.8``.
    """

    __slots__ = ()
    tokens: int
    verify_steps: int
    drafted: int
    accepted: int

    @property
    def tau(self) -> float:
        """Tokens per verify step (:func:`tau`)."""
        return tau(self.tokens, self.verify_steps)

    @property
    def accept_rate(self) -> float:
        """Accepted / drafted nodes (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0
