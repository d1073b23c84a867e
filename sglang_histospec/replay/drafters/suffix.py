"""ArcticInference SuffixDecoding (``arctic-inference==0.3.0``) as vLLM's ``method="suffix"`` drives it.

The call sequence and vLLM's defaults: :class:`SuffixDrafter`; docs/replay.md section 7.

Example::

    d = SuffixDrafter()            # raises PeerUnavailable without the package
    d.start("r", "p", [1, 2, 3]); d.draft("r", 8)
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.replay.drafters.peers import require
from sglang_histospec.replay.simulator import BaseDrafter


@dataclass(slots=True)
class SuffixConfig:
    """vLLM ``suffix_decoding_*`` settings."""

    max_tree_depth: int = 24
    """Longest context suffix matched (and tree depth)."""
    max_cached_requests: int = 10000
    """Responses kept in the global tree (FIFO)."""
    max_spec_factor: float = 1.0
    """A draft has at most max_spec_factor * match_len + max_spec_offset tokens."""
    max_spec_offset: float = 0.0
    """See max_spec_factor."""
    min_token_prob: float = 0.1
    """Stop at tokens whose estimated probability is below this."""
    use_tree_spec: bool = False
    """Tree drafts instead of a single path (vLLM uses paths)."""


def _load():
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as e:
        raise require("suffix", "ArcticInference (arctic-inference==0.3.0)", e) from e
    return SuffixDecodingCache


def to_draft(token_ids: list[int], parents: list[int], probs: list[float], match_len: int) -> Draft:
    """Reorder a peer's tree (parents may follow children) into the BFS order ``Draft`` requires."""
    n = len(token_ids)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p if p >= 0 else ROOT, []).append(i)
    order, new_index, frontier = [], {}, children.get(ROOT, [])
    while frontier:
        nxt = []
        for i in frontier:
            new_index[i] = len(order)
            order.append(i)
            nxt.extend(children.get(i, []))
        frontier = nxt
    if len(order) != n:
        raise RuntimeError(f"peer draft is not a tree: parents={parents}")
    return Draft(
        [int(token_ids[i]) for i in order],
        [ROOT if parents[i] < 0 else new_index[parents[i]] for i in order],
        [float(probs[i]) for i in order],
        match_len=int(match_len),
        source="global",
    )


class SuffixDrafter(BaseDrafter):
    """SuffixDecoding: the request's prompt + response tree and the global tree of past responses.

    Per request: ``start_request(req_id, prompt)`` (per-request prompt tree; a slot in the global response tree),
    then per verify step ``speculate(req_id, last max_tree_depth context tokens, max_spec_tokens=budget,
    max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec)`` and ``add_active_response(req_id, emitted
    tokens)`` (which also grows the global tree, live); ``stop_request`` at the end (the response stays in the
    global tree, FIFO-evicted past ``max_cached_requests``; with ``reset="step"`` a fresh cache at every step
    boundary, so only the open step's responses are in it). Defaults are vLLM's: depth 24, 10000 cached requests,
    spec factor 1.0, offset 0, min token probability 0.1, path (not tree) drafts.
    """

    name = "suffix"
    sources = ("self", "global")
    live_global = True

    def __init__(self, cfg: SuffixConfig | None = None, reset: str = "never") -> None:
        self.cfg = cfg or SuffixConfig()
        self._cache_cls = _load()
        self.cache = self._new_cache()
        self._ctx: dict[str, list[int]] = {}
        self.resets_each_step = reset == "step"

    def _new_cache(self):  # noqa: ANN202
        c = self.cfg
        return self._cache_cls(max_tree_depth=c.max_tree_depth, max_cached_requests=c.max_cached_requests)

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None:
        self.cache.start_request(req_id, list(prompt))
        self._ctx[req_id] = list(prompt)

    def extend(self, req_id: str, tokens: list[int]) -> None:
        self.cache.add_active_response(req_id, list(tokens))
        self._ctx[req_id].extend(tokens)

    def draft(self, req_id: str, budget: int) -> Draft:
        if budget <= 0:
            return Draft.empty()
        c = self.cfg
        ctx = self._ctx[req_id][-c.max_tree_depth :]
        d = self.cache.speculate(
            req_id,
            ctx,
            max_spec_tokens=budget,
            max_spec_factor=c.max_spec_factor,
            max_spec_offset=c.max_spec_offset,
            min_token_prob=c.min_token_prob,
            use_tree_spec=c.use_tree_spec,
        )
        if not d.token_ids:
            return Draft.empty()
        return to_draft(d.token_ids, d.parents, d.probs, d.match_len)

    def finish(self, req_id: str, response: list[int]) -> None:
        self.cache.stop_request(req_id)
        self._ctx.pop(req_id, None)

    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        if self.resets_each_step:
            self.cache = self._new_cache()
