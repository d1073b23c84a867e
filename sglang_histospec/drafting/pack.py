"""Fixed-size tree layout that an engine verifies (SGLang NGRAM's contract, docs/drafting.md section 11).

Example: the draft root -> 5 -> 6 and root -> 7 packed into 5 nodes with root token 9::

    p = pack_draft(Draft([5, 7, 6], [ROOT, ROOT, 0], [0.6, 0.4, 0.6]), root_token=9, num_nodes=5)
    p.tokens.tolist()  == [9, 5, 7, 6, 0]       # node 0 = root, BFS, then padding (token 0)
    p.parents.tolist() == [-1, 0, 0, 1, 0]      # padding hangs off the root
    p.num_real == 4
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_histospec.drafting.types import MAX_TOKEN_ID, ROOT, Draft

PAD_TOKEN = 0
"""Token of padding nodes; each padding node is a child of node 0 and sees only node 0 and itself."""


@dataclass(frozen=True)
class PackedDraft:
    """A draft tree padded to exactly N nodes, node 0 being the last committed token."""

    tokens: np.ndarray  # int64 [N] node 0 = root token, nodes 1..num_real-1 the draft in BFS order, then padding
    parents: np.ndarray  # int64 [N] parent node index; node 0: -1
    mask: np.ndarray  # bool [N, N] mask[i, j] = j is an ancestor of i or j == i
    num_real: int
    """Real nodes including the root; nodes num_real..N-1 are padding."""


def pack_draft(draft: Draft, root_token: int, num_nodes: int) -> PackedDraft:
    """Pack ``draft`` into ``num_nodes`` nodes (the first ``num_nodes - 1`` draft nodes are kept: a BFS prefix)."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes!r}: expected an int >= 1 (node 0 is the root)")
    if (
        isinstance(root_token, bool)
        or not isinstance(root_token, (int, np.integer))
        or not 0 <= root_token < MAX_TOKEN_ID
    ):
        raise ValueError(f"root_token={root_token!r}: expected a token id in [0, 2**31)")
    problem = draft.check()
    if problem is not None:
        raise ValueError(f"draft is malformed: {problem}")
    n = int(num_nodes)
    real = min(len(draft), n - 1)
    tokens = np.full(n, PAD_TOKEN, dtype=np.int64)
    parents = np.zeros(n, dtype=np.int64)
    tokens[0] = root_token
    parents[0] = -1
    if real:
        tokens[1 : real + 1] = draft.token_ids[:real]
        par = np.asarray(draft.parents[:real], dtype=np.int64)
        parents[1 : real + 1] = np.where(par == ROOT, 0, par + 1)
    mask = np.zeros((n, n), dtype=bool)
    mask[0, 0] = True
    for i in range(1, n):
        mask[i] = mask[parents[i]]  # parents come before children, so the parent's row is complete
        mask[i, i] = True
    return PackedDraft(tokens, parents, mask, real + 1)
