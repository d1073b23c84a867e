"""Target-distribution processing and lossless tree verification (one-hot multi-draft speculative sampling).

Processing (SGLang's order): ``softmax(logits / T)``, then top-k, then top-p, each renormalised; greedy rows
(temperature 0 or top_k 1) keep ``softmax(logits)`` for their logprobs and pick the argmax. Verification, in its
one-uniform form (``sample_rows`` + ``TreeBatch.walk``): one draw from q at every node of every tree, then each tree is
walked from the root along the children that carry the drawn tokens; the first drawn token with no such child is the
final one. Child x is taken exactly when the draw is x, with probability q(x), as in the sequential rule of multi-draft
speculative sampling (``tests/helpers/sequential_verify.py``, the reference the tests compare against; duplicate
siblings are never taken twice in either), so both produce the same output distribution. Example: ``process_logits``.
"""

from __future__ import annotations

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
