"""Native (C++17) backend of the anchor scorer: the drafts and learnt statistics of ``AnchorIndex``, bit for bit.

``NativeAnchorIndex`` wraps ``_native.AnchorDrafter`` (sources: ``csrc/anchors.{h,cc}``); the pure-Python
``AnchorIndex`` (``anchors.py``) is its specification. Importing this module raises ImportError when the extension
was not built or predates the anchor scorer (the facade then falls back to ``AnchorIndex``).

Example (the example of ``anchors.py``)::

    idx = NativeAnchorIndex(min_match=1, max_match=32, prompt_tail=1, sources=("history",))
    idx.set_history("p", [np.array([7, 1, 2, 3], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [5, 7]); idx.draft_batch(["r"], [2])[0][0]   # [1, 2]
"""

from __future__ import annotations

import numpy as np

import sglang_histospec.drafting._native as _native
from sglang_histospec.drafting import anchors
from sglang_histospec.drafting.native import NativeBackend, check_draft_threads
from sglang_histospec.drafting.types import SOURCES

_stale = {k: v for k, v in _native.ANCHOR_CONSTANTS.items() if getattr(anchors, k) != v}
if _stale:  # csrc/anchors.h no longer mirrors anchors.py: rebuild, or update its constants
    raise ImportError(f"the native anchor scorer was built with other constants than anchors.py: {_stale}")


class NativeAnchorIndex(NativeBackend):
    """Native backend of the anchor scorer; same interface as ``AnchorIndex`` (``docs/drafting.md`` section 9).

    Sources are immutable corpora (tokens, postings token -> positions) swapped in under a lock, so a draft keeps
    reading the ones it started with; ``draft_batch`` drafts the whole batch without the GIL, over ``draft_threads``
    threads (each request and the running siblings it reads locked, the learnt tables read-locked); the learnt tables
    are shared by all requests and updated when a draft's outcome is known (in ``extend`` and ``remove_request``).
    """

    def __init__(
        self, *, min_match: int, max_match: int, prompt_tail: int, sources: tuple[str, ...], draft_threads: int = 1
    ) -> None:
        unknown = [s for s in sources if s not in SOURCES]
        if unknown:
            raise ValueError(f"unknown source {unknown[0]!r}: expected a subset of {SOURCES}")
        lows = {"min_match": (min_match, 1), "max_match": (max_match, min_match), "prompt_tail": (prompt_tail, 0)}
        for name, (value, low) in lows.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name}={value!r}: expected an int >= {low}")
        self.min_match, self.max_match, self.prompt_tail = int(min_match), int(max_match), int(prompt_tail)
        self.sources = tuple(s for s in SOURCES if s in sources)
        self._impl = _native.AnchorDrafter(
            min_match=self.min_match,
            max_match=self.max_match,
            prompt_tail=self.prompt_tail,
            sources=list(self.sources),
            draft_threads=check_draft_threads(draft_threads),
        )

    def learnt_counts(self) -> dict[str, np.ndarray]:
        """Debug: copies of the learnt tables, named as ``AnchorIndex``'s attributes: ``tries`` and ``hits``
        [NUM_CLASSES, DEPTH_MAX], ``bin_nodes`` and ``bin_hits`` ``NUM_BINS`` (length, raw score, best rate, share classes),
        all int64."""
        tries, hits, bin_nodes, bin_hits = self._impl.learnt_counts()
        bins = anchors.NUM_BINS
        return {"tries": tries, "hits": hits, "bin_nodes": bin_nodes.reshape(bins), "bin_hits": bin_hits.reshape(bins)}
