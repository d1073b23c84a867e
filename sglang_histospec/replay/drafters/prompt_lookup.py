"""Prompt-lookup decoding (n-gram match in the request's own context), with vLLM's ngram proposer semantics.

Rule and vLLM's defaults: :class:`PromptLookupDrafter`; docs/replay.md section 7.

Example::

    >>> d = PromptLookupDrafter(min_n=2, max_n=3)
    >>> d.start("r", "p", [1, 2, 3, 4, 1, 2])
    >>> d.draft("r", 3).token_ids
    [3, 4, 1]
"""

from __future__ import annotations

from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.replay.simulator import BaseDrafter


class PromptLookupDrafter(BaseDrafter):
    """Chain drafts copied from the earliest earlier occurrence of the longest matching context suffix.

    Documented behaviour reproduced (vLLM ``method="ngram"``, our own code): find the longest n in
    [min_n, max_n] such that the last n context tokens occur earlier in the context; take the earliest such
    occurrence and propose the (up to) k tokens that follow it, never past the end of the context. No match: no
    draft. vLLM's defaults are ``prompt_lookup_min = prompt_lookup_max = 5`` when neither is given.
    """

    name = "prompt-lookup"
    sources = ("self",)

    def __init__(self, min_n: int = 5, max_n: int = 5) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._ctx: dict[str, list[int]] = {}
        self._first: dict[str, dict[tuple[int, ...], int]] = {}

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None:
        self._ctx[req_id] = []
        self._first[req_id] = {}
        self.extend(req_id, prompt)

    def extend(self, req_id: str, tokens: list[int]) -> None:
        ctx, first = self._ctx[req_id], self._first[req_id]
        for t in tokens:
            ctx.append(t)
            end = len(ctx)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(ctx[end - n :])
                if key not in first:
                    first[key] = end - n  # earliest start of this n-gram

    def draft(self, req_id: str, budget: int) -> Draft:
        ctx, first = self._ctx[req_id], self._first[req_id]
        c = len(ctx)
        if budget <= 0:
            return Draft.empty()
        for n in range(min(self.max_n, c - 1), self.min_n - 1, -1):
            pos = first.get(tuple(ctx[c - n :]))
            if pos is not None and pos < c - n:
                toks = ctx[pos + n : pos + n + budget]
                if toks:
                    k = len(toks)
                    return Draft(toks, [ROOT, *range(k - 1)], [1.0] * k, match_len=n, source="self")
        return Draft.empty()

    def finish(self, req_id: str, response: list[int]) -> None:
        self._ctx.pop(req_id, None)
        self._first.pop(req_id, None)
