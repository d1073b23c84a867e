"""Which draft nodes a verify step verifies: the drafter's trees within the policy's budgets, cut and packed.

``DraftSelector.select`` asks the draft-size policy (``engine/policy.py``) for the step's budgets, the drafter for
trees within them and the policy for their cut, and packs the kept nodes into the step's ``TreeBatch``.

Example (``pack_draft``, the per-request part): the draft root -> 5 -> 6 and root -> 7, path probabilities 0.9, 0.2
(node 6) and 0.5, with ``min_score=0.4`` keeps draft nodes 0 and 1::

    pack_draft(Draft([5, 7, 6], [ROOT, ROOT, 0], [0.9, 0.5, 0.2]), budget=4, vocab_size=64, min_score=0.4)
    # ([0, 5, 7], [-1, 0, 0], [0, 1]): the root (token filled in later), 5 and 7, both children of the root
"""

from __future__ import annotations

import time

import numpy as np

from sglang_histospec.drafting import ROOT, Draft
from sglang_histospec.drafting.flat import FlatDrafts
from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.engine.policy import DraftPolicy, Selection
from sglang_histospec.engine.request import RequestState, tell_drafter
from sglang_histospec.engine.treebatch import TreeBatch

_NO_NODES = np.zeros(0, dtype=np.int64)


def pack_draft(
    draft: Draft, budget: int, vocab_size: int, min_score: float = 0.0, scores: list[float] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Of the draft's first ``budget`` nodes (a BFS prefix), keep those whose token is in the vocabulary, whose score
    (``scores[i]``, default the draft's path probability) is at least ``min_score`` and whose parent was kept.

    Returns (tokens, parents, kept) of the packed tree: node 0 = root (token filled in by the caller), kept draft
    node ``kept[j]`` -> node j + 1, parent ROOT -> 0. The reference of :func:`pack_flat`, which packs a whole step.
    """
    if scores is None:
        scores = draft.probs
    tokens, parents, kept = [0], [-1], []
    remap: dict[int, int] = {ROOT: 0}
    for i, (tok, par) in enumerate(zip(draft.token_ids[:budget], draft.parents)):
        if par not in remap or not 0 <= tok < vocab_size or scores[i] < min_score:
            continue
        remap[i] = len(tokens)
        tokens.append(int(tok))
        parents.append(remap[par])
        kept.append(i)
    return tokens, parents, kept


def pack_flat(flat: FlatDrafts, keep: np.ndarray, vocab_size: int) -> np.ndarray:  # [n] bool
    """The nodes of ``flat`` a step verifies: those marked in ``keep`` [n] bool whose token is in the vocabulary and
    whose ancestors are all kept (:func:`pack_draft` of every draft at once, with scores 1.0 / 0.0 and
    ``min_score`` 0.5)."""
    ok = keep & (flat.tokens >= 0) & (flat.tokens < vocab_size)
    par = flat.parents
    if not (ok & (par >= 0) & ~ok[np.maximum(par, 0)]).any():  # closed already (the cut keeps parents first)
        return ok
    return flat.along_paths(ok, np.logical_and)


def _tree_nodes(flat: FlatDrafts, kept: np.ndarray, ask: list[int]) -> tuple[np.ndarray, ...]:
    """The kept nodes (flat indices, in order) and, for ``TreeBatch.from_nodes``, their requests (draft i is
    request ``ask[i]``'s) and parents within their trees (node j of a tree = its j-th kept node, root 0)."""
    nodes = np.flatnonzero(kept)
    draft = flat.owner[nodes]
    local = np.arange(1, len(nodes) + 1) - np.searchsorted(draft, draft, side="left")
    where = np.zeros(len(flat), dtype=np.int64)
    where[nodes] = local
    par = flat.parents[nodes]
    return nodes, np.asarray(ask, dtype=np.int64)[draft], np.where(par >= 0, where[np.maximum(par, 0)], 0)


class DraftSelector:
    """Builds each step's trees: the policy's budgets (``policy.step_budgets``), the drafter's trees within them
    (told first what their requests emitted since it last heard), the policy's cut (``policy.cut``), packed.

    ``policy`` is a ``DraftPolicy`` (``engine/policy.py``), ``drafter`` the engine's ``drafting.Drafter``,
    ``vocab_size`` the model's (nodes outside it are dropped)."""

    def __init__(self, policy: DraftPolicy, drafter: Drafter, vocab_size: int) -> None:
        self.policy = policy
        self.drafter = drafter
        self.vocab_size = vocab_size

    def select(self, running: list[RequestState], prefill: int, started: float) -> Selection:
        """Draft, cut and pack the trees of a step that also carries ``prefill`` merged prefill tokens;
        ``started`` is the step's ``time.perf_counter()`` start (the drafting time is measured from it)."""
        budgets = self.policy.step_budgets(running)
        roots = [st.tokens[-1] for st in running]
        if not any(budgets):  # a plain step (most steps where drafting does not pay): as cheap as the plain engine's
            return Selection(TreeBatch.build([None] * len(running), roots), None, _NO_NODES, False)
        ask = [i for i, b in enumerate(budgets) if b > 0]
        limits = [budgets[i] for i in ask]
        tell_drafter(self.drafter, [running[i] for i in ask])  # what they emitted since the drafter last heard
        flat = FlatDrafts.of(self.drafter.draft_batch([running[i].req.rid for i in ask], limits), limits)
        keep, probs = self.policy.cut(flat, len(running), prefill)
        nodes, owner, parents = _tree_nodes(flat, pack_flat(flat, keep, self.vocab_size), ask)
        tb = TreeBatch.from_nodes(roots, owner, flat.tokens[nodes], parents)
        predicted = 0.0 if probs is None else float(probs[nodes].sum())
        return Selection(tb, flat, nodes, True, predicted, time.perf_counter() - started)
