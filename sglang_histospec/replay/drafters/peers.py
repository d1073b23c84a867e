"""The error a peer drafter (``sglang-ngram``, ``suffix``) raises when its package is not installed.

Example: ``raise require("suffix", "arctic_inference", exc) from exc`` names ``make install-peers``.
"""

from __future__ import annotations


class PeerUnavailable(RuntimeError):
    """A peer drafter's package is not installed (the message names the make target)."""


def require(drafter: str, package: str, exc: BaseException) -> PeerUnavailable:
    """The error for a peer drafter whose package ``package`` failed to import with ``exc``."""
    return PeerUnavailable(
        f"drafter {drafter!r} needs {package}, which is not importable here ({type(exc).__name__}: {exc}); "
        "install it with `make install-peers` (see docs/replay.md)"
    )
