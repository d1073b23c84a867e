"""Peer drafters run from their own packages, driven as their engines drive them (for ``histospec replay``).

* ``sglang_ngram.SGLangNgramDrafter``: SGLang 0.5.23's NGRAM corpus (``NgramCorpus``), per verify step
  ``synchronize`` -> ``batch_get`` on the request's last ``max_trie_depth`` context tokens -> ``batch_put`` of the
  same window; ``erase_match_state`` when the request ends (``NGRAMWorker`` on CPU, non-overlap mode).
* ``suffix.SuffixDrafter``: ArcticInference's ``SuffixDecodingCache`` as vLLM's ``method="suffix"`` uses it:
  ``start_request`` with the prompt, ``add_active_response`` with the emitted tokens, ``speculate`` on the
  last ``max_tree_depth`` context tokens, ``stop_request`` at the end.

Both packages are optional and imported lazily; ``make install-peers`` installs them (docs/replay.md).
"""

from __future__ import annotations


class PeerUnavailable(RuntimeError):
    """A peer drafter's package is not installed (the message names the make target)."""


def require(drafter: str, package: str, exc: BaseException) -> PeerUnavailable:
    return PeerUnavailable(
        f"drafter {drafter!r} needs {package}, which is not importable here ({type(exc).__name__}: {exc}); "
        "install it with `make install-peers` (see docs/replay.md)"
    )
