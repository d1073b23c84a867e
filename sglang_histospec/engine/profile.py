"""Timed dummy verify passes that seed the cost cut's step model before the first real drafting step.

Without them the cut has no cost model for its first ``StepCostConfig.min_steps`` drafting steps and keeps every
draft node, which on a CPU makes those steps several times slower than plain ones. The passes run the same work a
verify step runs (the forward over the query rows, the logits and the softmax) at a few sizes; the first round only
warms the forward up and is not timed.

Example::

    for batch, rows, seconds in profile_verify(fwd, cache, max_batch=8, extra_per_request=16):
        step_cost.observe(batch, rows, seconds)
"""

from __future__ import annotations

import time

import torch

from sglang_histospec.engine.model import KVCache, TreeForward

CONTEXT = 32
"""Cached keys every dummy request attends to (a short prompt)."""


def design_points(max_batch: int, extra_per_request: int) -> list[tuple[int, int]]:
    """(requests, extra rows per request) pairs to time: 1 request with and without a full draft, and
    ``max_batch`` requests without drafts and with as many extra rows in all as 8 full drafts (at least 1 each).

    Example: ``design_points(4, 16)`` is ``[(1, 0), (1, 16), (4, 0), (4, 33)]``.
    """
    if max_batch == 1:
        return [(1, 0), (1, extra_per_request)]
    wide = max(1, (8 * (1 + extra_per_request)) // max_batch - 1)
    return [(1, 0), (1, extra_per_request), (max_batch, 0), (max_batch, wide)]


def verify_pass(fwd: TreeForward, cache: KVCache, batch: int, extra: int, context: int = CONTEXT) -> None:
    """One forward of ``batch`` requests with ``1 + extra`` causal query rows after up to ``context`` cached keys, then
    its logits and softmax: the cost shape of a verify step. The K/V written are dummies; the token ids vary over the
    vocabulary without id 0 (a padding id embeds as zeros). Example: ``verify_pass(fwd, cache, 8, 15, context=512)``
    runs 8 x 16 rows."""
    extra = min(extra, cache.max_capacity - 1)
    context = max(0, min(context, cache.max_capacity - 1 - extra))
    n, t = 1 + extra, context + 1 + extra
    cache.ensure(batch, t)
    dev = fwd.device
    ids = 1 + torch.arange(batch * n, device=dev).view(batch, n) % (fwd.model.config.vocab_size - 1)
    pos = torch.arange(context, t, device=dev).expand(batch, n).contiguous()
    mask = torch.ones((n, t), dtype=torch.bool, device=dev).tril(context)[None, None].expand(batch, 1, n, t)
    hidden = fwd.forward(ids, pos, pos, mask, cache, slot_start=0)
    torch.softmax(fwd.logits(hidden.reshape(batch * n, -1)), dim=-1)


def profile_verify(
    fwd: TreeForward, cache: KVCache, max_batch: int, extra_per_request: int, rounds: int = 2
) -> list[tuple[int, int, float]]:
    """``(requests, query rows, seconds)`` of ``rounds`` timed passes at every design point (after one untimed
    warm-up round). ``max_batch`` and ``extra_per_request`` must be >= 1. The passes write dummy K/V into ``cache``
    (call it on an empty one, as the engine does at start) and hand back the storage it had: a cache grown here
    would be doubled by the first ``reserve``, and an engine so profiled would then run on another memory layout
    (another size and strides) than a plain engine of the same shapes."""
    if max_batch < 1 or extra_per_request < 1 or rounds < 1:
        raise ValueError(
            f"max_batch={max_batch}, extra_per_request={extra_per_request}, rounds={rounds}: use values >= 1"
        )
    points = design_points(min(max_batch, cache.max_slots), extra_per_request)
    out = []
    before = cache.data
    try:
        for r in range(rounds + 1):
            for batch, extra in points:
                started = time.perf_counter()
                verify_pass(fwd, cache, batch, extra)
                if r:
                    out.append((batch, batch * (1 + extra), time.perf_counter() - started))
    finally:
        cache.data = before
    return out


__all__ = ["CONTEXT", "design_points", "profile_verify", "verify_pass"]
