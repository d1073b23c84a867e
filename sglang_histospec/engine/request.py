"""The state of one running request: its tokens, how many have their K/V cached, and its seeded uniform stream.

Every part of a step reads or updates it: the scheduler creates it, the input builder lays out its pending tokens,
the verifier draws with its uniforms, the commit appends what it emitted.

Example::

    st = RequestState(req, rng=np.random.default_rng(0), tokens=[1, 5, 7], stop_ids=frozenset({2}))
    st.pending                          # 2: tokens[:2] still need their K/V (7, the last one, is the next root)
    st.uniforms_at(np.array([0, 1, 1]))  # [u0, u1, u1]: the uniforms of output positions 0, 1 and 1
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.engine.types import GenerateRequest


@dataclass(slots=True)
class RequestState:
    req: GenerateRequest
    rng: np.random.Generator
    tokens: list[int]  # prompt + output; the last one is the root of the next verify step (its KV not cached)
    stop_ids: frozenset[int]
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kv_len: int = 0  # tokens[:kv_len] have their K/V in the cache slot
    uniforms: np.ndarray = field(default_factory=lambda: np.empty(0))  # u[skip + j] draws output token j
    skip: int = 0  # sampling.seed_offset: uniforms used by the tokens emitted before a resumption
    told: int = 0  # output tokens the drafter was told (``tell_drafter`` catches it up before it drafts)
    verify_ct: int = 0
    draft_ct: int = 0
    accept_ct: int = 0
    finish: dict | None = None

    @property
    def pending(self) -> int:
        """Tokens before the root whose K/V is not cached yet (a new request's prompt minus its last token)."""
        return len(self.tokens) - 1 - self.kv_len

    def uniforms_at(self, offsets: np.ndarray) -> np.ndarray:
        """The uniforms of output positions ``skip + len(output) + offsets`` (``offsets`` [n] int64, a tree's node
        depths).

        Output token j is always drawn with the request's j-th uniform, whatever the drafts: every node at depth d of
        a step's tree uses the uniform of position ``len(output) + d`` (only one node per depth is ever on the walked
        path), so a seeded request emits the same tokens with and without speculation.
        """
        base = self.skip + len(self.output)
        need = base + int(offsets.max()) + 1
        if len(self.uniforms) < need:
            self.uniforms = np.concatenate([self.uniforms, self.rng.random(max(64, need - len(self.uniforms)))])
        return self.uniforms[base + offsets]


def tell_drafter(drafter: Drafter, states: list[RequestState]) -> None:
    """Tell the drafter the output tokens of ``states`` it has not heard yet (one ``extend_batch``)."""
    late = [st for st in states if len(st.output) > st.told]
    if not late:
        return
    rids, tokens = [st.req.rid for st in late], [st.output[st.told :] for st in late]
    for st in late:
        st.told = len(st.output)
    drafter.extend_batch(rids, tokens)
