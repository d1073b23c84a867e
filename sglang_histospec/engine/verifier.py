"""The verify step after the forward: the target distribution at every tree node, one draw per node, the walk.

Rules: :func:`verify`. Example (greedy, one request whose root draws 7 and whose node 1, token 7, draws 3; node 1
has no children)::

    tb = TreeBatch.build([([0, 7], [-1, 0])], root_tokens=[5])
    v = verify([st], tb, logits)   # logits [2, V]: argmax 7 at row 0, 3 at row 1
    v.walks[0].tokens              # [7, 3]: node 1 accepted, then the bonus token
    v.walks[0].accepted_nodes      # [1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sglang_histospec.engine.request import RequestState
from sglang_histospec.engine.sampling import process_logits, sample_rows
from sglang_histospec.engine.treebatch import TreeBatch, WalkResult


@dataclass(slots=True)
class Verdict:
    """The outcome of one verify step."""

    walks: list[WalkResult]
    """Per running request: accepted nodes, emitted tokens, the rows they were drawn at."""
    logprobs: list[float] | None
    """[sum of emitted tokens] log q of every emitted token, in (request, token) order; None when no running
    request asked for logprobs."""


def verify(
    running: list[RequestState],
    tb: TreeBatch,
    logits: torch.Tensor,  # [R, V] float32 logits of every tree row, in TreeBatch order
) -> Verdict:
    """Draw at every node of every tree and walk the trees (the module docstring has an example).

    Every request's sampling parameters are applied to its rows (:func:`target_probs`); every node then draws one
    token from its distribution (the argmax for greedy requests; for sampled ones the inverse CDF at the request's
    own seeded uniform of output position ``len(output) + depth``, ``RequestState.uniforms_at``), and each tree is
    walked from the root along the children that carry the drawn tokens (``TreeBatch.walk``): the one-uniform form
    of lossless multi-draft verification (``sampling.py``). The logprob of an emitted token is log q(token) at the
    node it was drawn at.
    """
    greedy = np.array([st.req.sampling.is_greedy for st in running])
    probs = target_probs(running, tb, greedy, logits)
    walks = tb.walk(draw(running, tb, greedy, probs).cpu().numpy())
    logprobs = None
    if any(st.req.return_logprob for st in running):
        dev = probs.device
        flat_rows = [r for w in walks for r in w.rows]
        flat_toks = [t for w in walks for t in w.tokens]
        picked = probs[torch.tensor(flat_rows, device=dev), torch.tensor(flat_toks, device=dev)]
        logprobs = torch.log(picked.double()).cpu().tolist()
    return Verdict(walks, logprobs)


def target_probs(
    running: list[RequestState],
    tb: TreeBatch,
    greedy: np.ndarray,  # [B] bool
    logits: torch.Tensor,  # [R, V] float32
) -> torch.Tensor:  # [R, V] float32 processed distribution of every row
    """Each request's temperature, top-k and top-p applied to its rows (greedy rows: plain softmax)."""
    dev = logits.device
    sp = [st.req.sampling for st in running]
    reps = None if tb.num_rows == len(running) else torch.from_numpy(tb.counts).to(dev)

    def per_row(values, dtype):
        t = torch.tensor(values, device=dev, dtype=dtype)
        return t if reps is None else t.repeat_interleave(reps)

    return process_logits(
        logits,
        per_row([0.0 if g else float(s.temperature) for s, g in zip(sp, greedy)], torch.float32),
        per_row([s.top_k for s in sp], torch.int64),
        per_row([float(s.top_p) for s in sp], torch.float32),
    )


def draw(
    running: list[RequestState],
    tb: TreeBatch,
    greedy: np.ndarray,  # [B] bool
    probs: torch.Tensor,  # [R, V] float32
) -> torch.Tensor:  # [R] int64 the token drawn at every row
    """One draw from q at every node: the argmax for greedy requests, the seeded inverse CDF for the others (a
    node at depth d uses the uniform of output position len(output) + d)."""
    dev = probs.device
    offsets, depth = tb.offsets, tb.depth
    picked = probs.argmax(dim=-1) if greedy.any() else None
    sampled = np.flatnonzero(~greedy)
    if len(sampled) == len(running):  # all requests sample: every row, in order
        u = np.concatenate([st.uniforms_at(depth[offsets[b] : offsets[b + 1]]) for b, st in enumerate(running)])
        picked = sample_rows(probs, torch.from_numpy(u).to(dev))
    elif len(sampled):
        row_idx = torch.from_numpy(np.concatenate([np.arange(offsets[b], offsets[b + 1]) for b in sampled]))
        u = np.concatenate([running[b].uniforms_at(depth[offsets[b] : offsets[b + 1]]) for b in sampled])
        row_idx = row_idx.to(dev)
        picked[row_idx] = sample_rows(probs[row_idx], torch.from_numpy(u).to(dev))
    return picked
