"""The sequential form of lossless tree verification, for one request: the reference the engine's batched
verifier (``sample_rows`` + ``TreeBatch.walk``) is tested against; the engine itself never runs it.

At the current node with processed distribution q, the residual r starts as q; the children are tried in node
order, child x is accepted with probability ``r[x] / sum(r)``; on rejection ``r[x] = 0``. When a child is accepted
the walk moves to it; when all are rejected (or there are none) the final token is sampled from r / sum(r). Every
draft token is a one-hot proposal, so the emitted token at each node is distributed exactly as q: P(first child
x1) = q(x1), P(second child x2) = (1 - q(x1)) * q(x2) / (1 - q(x1)) = q(x2), and so on. Greedy: the child whose
token is the argmax is accepted, else the argmax is emitted. (Moved from ``sglang_histospec/engine/sampling.py``:
no product code calls it.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class VerifyOutcome:
    accepted_nodes: list[int]
    """Indices (into the packed tree, root = 0) of the accepted draft nodes, in path order (root excluded)."""
    tokens: list[int]
    """Emitted tokens: the accepted draft tokens, then the final (bonus or residual) token."""
    logprobs: list[float]
    """log q(token) of each emitted token under its node's processed distribution."""


def _sample(probs: np.ndarray, u: float) -> int:
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    # never return a zero-probability token (u * total can land on the last plateau through rounding)
    i = min(i, len(probs) - 1)
    while probs[i] <= 0 and i > 0:
        i -= 1
    return i


def verify_tree(
    probs,  # [n, V] processed distribution at each node: an array, or anything whose probs[i] is a float64 row
    tokens: list[int],  # [n] node tokens; tokens[0] is the root (not verified)
    parents: list[int],  # [n] parent node index; parents[0] = -1, parents[i] < i
    greedy: bool,
    rng: np.random.Generator | None,
) -> VerifyOutcome:
    """Walk the tree from the root and return what it emits (the rule of the module docstring).

    Example (greedy): probs argmax 7 at the root and 9 at node 1; tree root->7 (node 1), root->8 (node 2),
    7->3 (node 3): ``verify_tree(p, [0, 7, 8, 3], [-1, 0, 0, 1], True, None)`` accepts node 1, rejects node 3
    and emits ``[7, 9]``.
    """
    n = len(tokens)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    accepted: list[int] = []
    out_tokens: list[int] = []
    out_logprobs: list[float] = []
    node = 0
    while True:
        q = probs[node]
        if greedy:
            x = int(np.argmax(q))
            nxt = next((c for c in children[node] if tokens[c] == x), None)
            out_tokens.append(x)
            out_logprobs.append(float(np.log(q[x])) if q[x] > 0 else float("-inf"))
            if nxt is None:
                break
            accepted.append(nxt)
            node = nxt
            continue
        residual = None
        total = float(q.sum())
        moved = False
        for c in children[node]:
            x = tokens[c]
            r = q if residual is None else residual
            px = r[x]
            if px <= 0:
                continue
            if rng.random() * total < px:
                out_tokens.append(x)
                out_logprobs.append(float(np.log(q[x])))
                accepted.append(c)
                node = c
                moved = True
                break
            if residual is None:
                residual = q.copy()
            residual[x] = 0.0
            total = float(residual.sum())
        if moved:
            continue
        r = q if residual is None or total <= 0 else residual
        x = _sample(r, rng.random())
        out_tokens.append(x)
        out_logprobs.append(float(np.log(q[x])))
        break
    return VerifyOutcome(accepted, out_tokens, out_logprobs)
