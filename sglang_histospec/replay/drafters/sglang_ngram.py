"""SGLang 0.5.23's NGRAM corpus, driven as ``NGRAMWorker`` drives it on CPU (non-overlap scheduling).

The corpus is global (all prompts, all steps) and live; the call sequence per verify step and the padding rule:
:class:`SGLangNgramDrafter`; how SGLang is imported without its server stack: ``_light_import``; defaults, size
and install: docs/replay.md section 7. Example::

    d = SGLangNgramDrafter(budget=8)   # raises PeerUnavailable without the package (make install-peers)
    d.start("r", "p", [1, 2, 3]); d.draft("r", 8)
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from dataclasses import dataclass

import numpy as np

from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.replay.drafters.peers import require
from sglang_histospec.replay.simulator import BaseDrafter


@dataclass(slots=True)
class NgramConfig:
    """``--speculative-ngram-*`` settings of SGLang's server (same defaults)."""

    max_trie_depth: int = 18
    """Context tokens matched and inserted per step."""
    min_bfs_breadth: int = 1
    """Smallest BFS breadth."""
    max_bfs_breadth: int = 10
    """Largest BFS breadth (the server's topk)."""
    match_type: str = "BFS"
    """"BFS" or "PROB"."""
    capacity: int = 10_000_000
    """Trie capacity in nodes."""


_LOADED: list = []
"""The imported ``NgramCorpus`` class: its C++ type registers once per process, so it is never imported twice (even
when a caller drops the ``sglang`` modules from ``sys.modules``)."""


def _light_import():
    """Import ``NgramCorpus`` without running ``sglang/__init__.py``.

    ``import sglang`` would import the whole server stack, so the wrapper is imported with bare package
    objects for ``sglang``, ``sglang.srt`` and ``sglang.srt.utils`` and an ``is_cuda`` (False on this CPU path) for
    ``sglang.srt.utils.common``; everything that then runs is SGLang's own code (the C++ is JIT-compiled on first
    use, then cached: docs/replay.md section 7).
    """
    if _LOADED:
        return _LOADED[0]
    if "sglang.srt.speculative.cpp_ngram.ngram_corpus" in sys.modules:
        return sys.modules["sglang.srt.speculative.cpp_ngram.ngram_corpus"].NgramCorpus
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("No module named 'sglang'")
    root = os.path.dirname(spec.origin)
    if "sglang" not in sys.modules:
        for name, sub in (("sglang", ""), ("sglang.srt", "srt"), ("sglang.srt.utils", os.path.join("srt", "utils"))):
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(root, sub) if sub else root]
            sys.modules[name] = mod
        common = types.ModuleType("sglang.srt.utils.common")
        common.is_cuda = lambda: False
        sys.modules["sglang.srt.utils.common"] = common
    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

    _LOADED.append(NgramCorpus)
    return NgramCorpus


def tree_from_mask(ids: np.ndarray, mask: np.ndarray) -> Draft:
    """SGLang's (ids [N], mask [N, N], node 0 = root) -> ``Draft`` of nodes 1..N-1, trailing padding dropped.

    Example: ids [3, 4, 44, 0], mask rows [1000], [1100], [1010], [1001] -> root->4, root->44 (the last node is
    padding: token 0 under the root).
    """
    n = len(ids)
    parents: list[int] = []
    for i in range(1, n):
        anc = np.flatnonzero(mask[i, :i])
        p = int(anc.max()) if len(anc) else 0
        parents.append(ROOT if p == 0 else p - 1)
    toks = [int(t) for t in ids[1:]]
    k = len(toks)
    while k and toks[k - 1] == 0 and parents[k - 1] == ROOT:
        k -= 1
    return Draft(toks[:k], parents[:k], [1.0] * k, match_len=0, source="global") if k else Draft.empty()


class SGLangNgramDrafter(BaseDrafter):
    """SGLang's global n-gram trie over the recent context windows of every request.

    Per verify step of a request: ``synchronize()`` (waits for the previous insert), ``batch_get([req_id],
    [window], [total_len])`` with ``window`` = the last ``max_trie_depth`` tokens of prompt + output, then, after
    verification, ``batch_put([window])`` with the same window; ``erase_match_state([req_id])`` when it ends.
    Prompts are never inserted whole. The corpus is global (all prompts, all steps; with ``reset="step"`` only the
    open step: ``reset()`` at every step boundary, what ``clear_cache_pool`` does on a weight update). The result always has
    ``draft_token_num = budget + 1`` nodes (node 0 = the last context token); trailing padding nodes (token 0
    under the root) are dropped from the draft, but the engine verifies them, so ``pads_to_budget`` is set and
    est_speedup charges the full width. Defaults are the server's (``NgramConfig``; its size and ``capacity``:
    docs/replay.md section 7).
    """

    name = "sglang-ngram"
    sources = ("self", "global")
    live_global = True
    pads_to_budget = True

    def __init__(self, budget: int, cfg: NgramConfig | None = None, reset: str = "never") -> None:
        if budget < 1:
            raise ValueError(f"sglang-ngram needs a budget >= 1 (draft_token_num = budget + 1), got {budget}")
        self.cfg = cfg or NgramConfig()
        try:
            corpus_cls = _light_import()
        except ImportError as e:
            raise require("sglang-ngram", "SGLang 0.5.23 (sglang==0.5.23, apache-tvm-ffi, msgspec)", e) from e
        self.n = budget + 1
        c = self.cfg
        self.corpus = corpus_cls(
            max_trie_depth=c.max_trie_depth,
            min_bfs_breadth=c.min_bfs_breadth,
            max_bfs_breadth=c.max_bfs_breadth,
            draft_token_num=self.n,
            match_type=c.match_type,
            capacity=c.capacity,
        )
        self._ctx: dict[str, list[int]] = {}
        self._window: dict[str, list[int]] = {}
        self.resets_each_step = reset == "step"
        self._puts: list[list[int]] | None = None  # batched rounds: the windows to put at the round's end
        self._overlap_ns = 0

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None:
        self._ctx[req_id] = list(prompt)

    def extend(self, req_id: str, tokens: list[int]) -> None:
        self._ctx[req_id].extend(tokens)

    def budget(self, req_id: str, cap: int) -> int:
        return self.n - 1

    def draft(self, req_id: str, budget: int) -> Draft:
        ctx = self._ctx[req_id]
        window = ctx[-self.cfg.max_trie_depth :]
        self._window[req_id] = window
        self.corpus.synchronize()
        ids, mask = self.corpus.batch_get([req_id], [window], [len(ctx)])
        return tree_from_mask(ids, mask.reshape(self.n, self.n))

    def draft_round(self, req_ids: list[str], budgets: list[int]) -> list[Draft]:
        """One ``batch_get`` of every request's window, as the worker asks for a batch; the round's windows are
        put in one ``batch_put`` at ``end_round``."""
        if self._puts is None:
            self._puts = []
        ctxs = [self._ctx[r] for r in req_ids]
        windows = [c[-self.cfg.max_trie_depth :] for c in ctxs]
        self._window.update(zip(req_ids, windows))
        self.corpus.synchronize()
        ids, mask = self.corpus.batch_get(req_ids, windows, [len(c) for c in ctxs])
        ids, mask = (
            np.asarray(ids).reshape(len(req_ids), self.n),
            np.asarray(mask).reshape(len(req_ids), self.n, self.n),
        )
        return [tree_from_mask(i, m) for i, m in zip(ids, mask)]

    def observe(self, req_id: str, drafted: int, accepted: int) -> None:
        window = self._window.pop(req_id)
        if self._puts is None:
            self.corpus.batch_put([window])
        else:
            self._puts.append(window)

    def end_round(self) -> None:
        """Batched rounds: one ``batch_put`` of the round's windows; the insert that SGLang runs asynchronously, beside
        the next forward pass, is waited for here and reported by ``overlap_ns``."""
        self._overlap_ns = 0
        if self._puts:
            self.corpus.batch_put(self._puts)
            self._puts = []
            t0 = time.perf_counter_ns()
            self.corpus.synchronize()
            self._overlap_ns = time.perf_counter_ns() - t0

    def overlap_ns(self) -> int:
        return self._overlap_ns

    def finish(self, req_id: str, response: list[int]) -> None:
        self.corpus.erase_match_state([req_id])
        self._ctx.pop(req_id, None)
        self._window.pop(req_id, None)

    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        if self.resets_each_step:
            self.corpus.synchronize()
            self.corpus.reset()
