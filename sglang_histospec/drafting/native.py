"""Native (C++17) backend of the history index: same interface and drafts as ``ReferenceIndex``.

A suffix array per prompt, built and drafted from without the GIL (``NativeIndex``; sources: ``csrc/``). Importing
this module raises ImportError when the extension was not built (the facade then falls back to the reference).

Example (one history response ``[7, 1, 2, 3]`` whose first token ``7`` is the prompt tail)::

    idx = NativeIndex(min_match=1, max_match=8, tree=True, min_prob=0.1, use_frequency=True,
                      sources=("history",))
    idx.set_history("p", [np.array([7, 1, 2, 3], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [5, 7])
    idx.draft_batch(["r"], [2])  # -> [([1, 2], [-1, 0], [1.0, 1.0], 1, "history")]
"""

from __future__ import annotations

from typing import Any

import numpy as np

import sglang_histospec.drafting._native as _native
from sglang_histospec.drafting.reference import DraftTuple
from sglang_histospec.drafting.types import COUNTS_SOURCES, SOURCES

ABI_VERSION = 6
"""The extension's ABI this module needs (6: the anchor re-ranker); an older build is refused."""
if getattr(_native, "ABI_VERSION", 0) < ABI_VERSION:  # a stale build: rebuild with `make install`
    raise ImportError(
        f"sglang_histospec.drafting._native is outdated (ABI_VERSION={getattr(_native, 'ABI_VERSION', 0)}, "
        f"expected {ABI_VERSION}); rebuild it with `make install`"
    )


def check_draft_threads(draft_threads) -> int:
    """``draft_threads`` as an int; ValueError unless it is an int >= 1."""
    if isinstance(draft_threads, bool) or not isinstance(draft_threads, (int, np.integer)) or draft_threads < 1:
        raise ValueError(f"draft_threads={draft_threads!r}: expected an int >= 1 (1 drafts on the calling thread)")
    return int(draft_threads)


def _as_i32(seq) -> np.ndarray:  # [n] int32, C-contiguous (no copy when it already is)
    return np.ascontiguousarray(seq, dtype=np.int32)


class NativeBackend:
    """What both native backends share: the backend interface forwarded to the C++ object in ``self._impl``."""

    backend = "native"
    _impl: Any  # the pybind11 object (_native.Drafter or _native.AnchorDrafter)

    # ---- sources -------------------------------------------------------------------------------------------
    def set_history(self, prompt_id: str, sequences, weights: list[int]) -> None:
        self._impl.set_history(prompt_id, [_as_i32(s) for s in sequences], [int(w) for w in weights])

    def add_sibling(self, prompt_id: str, sequence, weight: int) -> None:
        self._impl.add_sibling(prompt_id, _as_i32(sequence), int(weight))

    def clear_siblings(self) -> None:
        self._impl.clear_siblings()

    def add_global(self, key: int, sequences, weights: list[int]) -> None:
        self._impl.add_global(int(key), [_as_i32(s) for s in sequences], [int(w) for w in weights])

    def remove_global(self, key: int) -> None:
        self._impl.remove_global(int(key))

    # ---- requests ------------------------------------------------------------------------------------------
    def start(self, req_id: str, prompt_id: str | None, prompt_tokens: list[int]) -> None:
        if isinstance(prompt_tokens, np.ndarray):
            self._impl.start_array(req_id, prompt_id, _as_i32(prompt_tokens))
        else:
            self._impl.start(req_id, prompt_id, prompt_tokens)

    def extend(self, req_id: str, tokens: list[int]) -> None:
        if isinstance(tokens, np.ndarray):
            self._impl.extend_array(req_id, _as_i32(tokens))
        else:
            self._impl.extend(req_id, tokens)

    def remove_request(self, req_id: str) -> None:
        self._impl.remove_request(req_id)

    def has_request(self, req_id: str) -> bool:
        return self._impl.has_request(req_id)

    def draft_batch(self, req_ids: list[str], budgets: list[int]) -> list[DraftTuple]:
        return self._impl.draft_batch(req_ids, budgets)

    def draft_threads(self) -> int:
        """Threads a ``draft_batch`` spreads its requests over."""
        return int(self._impl.draft_threads())

    # ---- accounting and checks ------------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        return int(self._impl.memory_bytes())

    def check_integrity(self) -> str | None:
        """Debug: walks every structure (suffix order, weights, caches); None when all invariants hold."""
        problem = self._impl.check_integrity()
        return problem or None


class NativeIndex(NativeBackend):
    """Native backend; same interface as ``ReferenceIndex`` (``docs/drafting.md`` section 9).

    Each prompt's history is a suffix array with prefix sums of integer weights (16 bytes per history token), built
    by SA-IS in linear time on ``set_history`` without the GIL and swapped in under a lock; drafting requests hold a
    reference to the structure they read, so a concurrent replacement never frees it under them. Every request keeps
    its longest-match state per source and advances it by the tokens passed to ``extend``; ``draft_batch`` drafts
    the whole batch without the GIL, over ``draft_threads`` threads. Sources: ``csrc/``.
    """

    def __init__(
        self,
        *,
        min_match: int,
        max_match: int,
        tree: bool,
        min_prob: float,
        use_frequency: bool,
        sources: tuple[str, ...],
        draft_threads: int = 1,
    ) -> None:
        unknown = [s for s in sources if s not in COUNTS_SOURCES]
        if unknown:
            raise ValueError(f"source {unknown[0]!r}: the counts scorer drafts from a subset of {COUNTS_SOURCES}")
        self.sources = tuple(s for s in SOURCES if s in sources)
        self._impl = _native.Drafter(
            min_match=int(min_match),
            max_match=int(max_match),
            tree=bool(tree),
            min_prob=float(min_prob),
            use_frequency=bool(use_frequency),
            sources=list(self.sources),
            draft_threads=check_draft_threads(draft_threads),
        )

    def history_tokens(self) -> int:
        return int(self._impl.history_tokens())
