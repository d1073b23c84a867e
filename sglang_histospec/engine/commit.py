"""What a verify step leaves behind: emitted tokens, finish checks, KV compaction, the drafter's history, results.

Per request, the walk's tokens are appended until a stop token or ``max_new_tokens`` (``emit``); the accepted path's
K/V, written at tree positions ``base + node``, moves to the consecutive positions ``base + 1, base + 2, ...``
(``compaction_moves``); the draft-size policy is told the tree depth and accepted length. The drafter hears what
the requests emitted lazily (``request.tell_drafter``, before a step drafts and before a request finishes), so that steps
decoded plainly cost the drafter nothing. A finished request becomes a ``GenerateResult`` and, unless aborted or
unrecorded, a response of the drafter's history (``Commit.finish``).

Example (``compaction_moves``): the root sits at cache index 10 and the walk accepted tree nodes 2 then 5; their
K/V move from 12 and 15 to 11 and 12, so the request's cache ends with the root and the accepted path::

    compaction_moves(10, [2, 5])    # [(12, 11), (15, 12)]; the request's kv_len becomes 10 + 1 + 2 = 13
"""

from __future__ import annotations

import collections

import numpy as np
import torch

from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.engine.policy import DraftPolicy
from sglang_histospec.engine.request import RequestState, tell_drafter
from sglang_histospec.engine.treebatch import TreeBatch, WalkResult
from sglang_histospec.engine.types import GenerateResult


def emit(st: RequestState, walk: WalkResult, logprobs: list[float] | None) -> int:
    """Append the walk's tokens (and their ``logprobs``, when given) to the request up to its first stop token or
    its ``max_new_tokens`` (setting ``st.finish``); returns how many it took."""
    for k, tok in enumerate(walk.tokens):
        st.output.append(tok)
        st.tokens.append(tok)
        if logprobs is not None:
            st.logprobs.append(logprobs[k])
        if tok in st.stop_ids:
            st.finish = {"type": "stop", "matched": tok}
        elif len(st.output) >= st.req.sampling.max_new_tokens:
            st.finish = {"type": "length", "length": len(st.output)}
        if st.finish is not None:
            return k + 1
    return len(walk.tokens)


def compaction_moves(root_at: int, accepted_nodes: list[int]) -> list[tuple[int, int]]:
    """(source, destination) cache indices that pack the accepted path right after the root at ``root_at``."""
    return [(root_at + node, root_at + k) for k, node in enumerate(accepted_nodes, start=1) if node != k]


class Commit:
    """Applies verify outcomes to the running requests, the KV cache (``move_tokens``), the drafter and the
    draft-size policy (``request_step`` / ``request_done`` of ``engine/policy.py``), and counts into the engine's ``stats``: verify_steps, draft_tokens, accepted_tokens,
    generated_tokens, step_tokens, requests_finished, requests_aborted.

    ``speculate``: the policy forgets finished ones;
    ``adaptive``: the policy learns each step's depth and accepted length; ``record_responses``: finished
    responses of requests with a prompt id go to the drafter's history."""

    def __init__(
        self,
        drafter: Drafter,
        policy: DraftPolicy,
        cache,
        device: torch.device,
        stats: collections.Counter,
        *,
        speculate: bool,
        adaptive: bool,
        record_responses: bool,
    ) -> None:
        self.drafter = drafter
        self.policy = policy
        self.cache = cache
        self.device = device
        self.stats = stats
        self.speculate = speculate
        self.adaptive = adaptive
        self.record_responses = record_responses

    def step(
        self,
        running: list[RequestState],
        tb: TreeBatch,
        walks: list[WalkResult],
        logprobs: list[float] | None,  # [sum of walk tokens] log q of every walked token, or None
        base: np.ndarray,  # [B] int64 cache index of each request's root
    ) -> int:
        """Commit one verify step; returns the tokens emitted by the whole batch."""
        depths = np.maximum.reduceat(tb.depth, tb.offsets[:-1]) if self.adaptive else None
        lp_at = step_emitted = 0
        moves: list[tuple[int, int, int]] = []  # (slot, source, destination)
        for b, (st, walk) in enumerate(zip(running, walks)):
            drafted = int(tb.counts[b]) - 1
            own = (
                logprobs[lp_at : lp_at + len(walk.tokens)] if logprobs is not None and st.req.return_logprob else None
            )
            lp_at += len(walk.tokens)
            emitted = emit(st, walk, own)
            accepted = min(emitted, len(walk.accepted_nodes))
            st.verify_ct += 1
            st.draft_ct += drafted
            st.accept_ct += accepted
            self.stats["verify_steps"] += 1
            self.stats["draft_tokens"] += drafted
            self.stats["accepted_tokens"] += accepted
            self.stats["generated_tokens"] += emitted
            self.stats["step_tokens"] += emitted
            step_emitted += emitted
            if depths is not None:  # the budgets count chain depth: the tree's depth, the accepted length
                self.policy.request_step(st.req.rid, int(depths[b]), accepted)
            if st.finish is None:
                root_at = int(base[b])
                moves += [(b, src, dst) for src, dst in compaction_moves(root_at, walk.accepted_nodes)]
                st.kv_len = root_at + 1 + len(walk.accepted_nodes)
        if moves:
            slot, src, dst = (torch.tensor(list(col), device=self.device) for col in zip(*moves))
            self.cache.move_tokens(slot, src, dst)
        return step_emitted

    def finish(self, st: RequestState) -> GenerateResult:
        """Close a finished (or aborted) request in the drafter and the policy and build its result."""
        req = st.req
        rid = req.rid
        if st.finish["type"] == "abort":
            self.drafter.abort(rid)
            self.stats["requests_aborted"] += 1
        else:
            if self.record_responses and req.prompt_id is not None:
                if self.speculate and st.draft_ct:  # its last drafts learn from the whole response
                    tell_drafter(self.drafter, [st])
                self.drafter.finish(rid, list(st.output))
            else:
                self.drafter.abort(rid)
            self.stats["requests_finished"] += 1
        if self.speculate:
            self.policy.request_done(rid)
        return GenerateResult(
            rid=rid,
            output_ids=list(st.output),
            finish_reason=st.finish,
            output_logprobs=list(st.logprobs) if req.return_logprob else None,
            prompt_tokens=len(req.input_ids),
            completion_tokens=len(st.output),
            spec_verify_ct=st.verify_ct,
            spec_draft_tokens=st.draft_ct,
            spec_accepted_tokens=st.accept_ct,
            prompt_id=req.prompt_id,
        )
