"""Target-distribution processing and lossless tree verification (one-hot multi-draft speculative sampling).

Processing (SGLang's order): ``softmax(logits / T)``, then top-k, then top-p, each renormalised. Greedy rows
(temperature 0 or top_k 1) keep ``softmax(logits)`` (for their logprobs) and pick the argmax.

Verification of one request's tree, root first (``verify_tree``): at the current node with processed
distribution q, the residual r starts as q; the children are tried in node order, child x is accepted with
probability ``r[x] / sum(r)``; on rejection ``r[x] = 0``. When a child is accepted the walk moves to it; when all
are rejected (or there are none) the final token is sampled from r / sum(r). Every draft token is a one-hot
proposal, so the emitted token at each node is distributed exactly as q: P(first child x1) = q(x1),
P(second child x2) = (1 - q(x1)) * q(x2) / (1 - q(x1)) = q(x2), and so on. Greedy: the child whose token is the
argmax is accepted, else the argmax is emitted.

The engine verifies a whole batch at once with the same rule in its one-uniform form (``sample_rows`` +
``TreeBatch.walk`` of ``treebatch.py``): it draws one token from q at every node of every tree in one batched inverse-CDF pass (the
argmax for greedy rows), then walks each tree from the root, moving to the child that carries the drawn token
and stopping at the first node whose drawn token has no such child (that token is the final one). The emitted
token at each visited node is a draw from q, and child x is taken exactly when the draw is x, with probability
q(x), as in the sequential rule (duplicate siblings are never taken twice there either), so both produce the same
output distribution; ``verify_tree`` stays as the per-request reference the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def process_logits(
    logits: torch.Tensor,  # [R, V] float32
    temperature: torch.Tensor,  # [R] float32; 0 = greedy
    top_k: torch.Tensor,  # [R] int64; <= 0 = off
    top_p: torch.Tensor,  # [R] float32; 1 = off
) -> torch.Tensor:  # [R, V] float32 processed probabilities (rows sum to 1)
    """Apply temperature, top-k and top-p per row (greedy rows: plain softmax).

    Example: logits ``[[2.0, 1.0, 0.0]]`` with T=1, top_k=2 give probs ``[[0.731, 0.269, 0.0]]``.
    """
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp[:, None]
    need_k = (top_k > 0) & (top_k < logits.shape[-1]) & ~greedy
    need_p = (top_p < 1.0) & ~greedy
    if not bool(need_k.any() or need_p.any()):
        return torch.softmax(scaled, dim=-1)
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(need_k, top_k, torch.full_like(top_k, logits.shape[-1]))
    sorted_logits = sorted_logits.masked_fill(ranks >= k[:, None], float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    # top-p: keep the smallest prefix (in descending order) whose mass reaches top_p (the first token always stays)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop = (mass_before >= top_p[:, None]) & need_p[:, None]
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)


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
    """Walk the tree from the root and return what it emits (see the module docstring).

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


_CHUNK = 1 << 22
"""Rows are processed in chunks of at most this many probabilities (float64 copies stay small for big vocabs)."""


def sample_rows(
    probs: torch.Tensor,  # [R, V] processed probabilities (rows sum to 1)
    u: torch.Tensor,  # [R] float64 uniforms in [0, 1)
) -> torch.Tensor:  # [R] int64 sampled token per row
    """Inverse-CDF draw per row in float64 (never a token of probability 0).

    Example: ``sample_rows(torch.tensor([[0.2, 0.0, 0.8]]), torch.tensor([0.5], dtype=torch.float64))`` is
    ``tensor([2])``.
    """
    rows, vocab = probs.shape
    out = torch.empty(rows, dtype=torch.int64, device=probs.device)
    step = max(1, _CHUNK // max(1, vocab))
    for lo in range(0, rows, step):
        sel = probs[lo : lo + step].double()
        cdf = torch.cumsum(sel, dim=-1)
        target = (u[lo : lo + step].to(cdf.device) * cdf[:, -1])[:, None]
        picked = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)
        bad = sel.gather(-1, picked) <= 0  # only through rounding at the very top of the CDF
        out[lo : lo + step] = torch.where(bad, sel.argmax(-1, keepdim=True), picked)[:, 0]
    return out
