"""Deprecated package: the peer drafters moved to ``sglang_histospec.replay.drafters`` (for one release)."""

from sglang_histospec._moved import warn_moved
from sglang_histospec.replay.drafters.registry import PeerUnavailable, require

warn_moved("peers", "replay.drafters", stacklevel=2)

__all__ = ["PeerUnavailable", "require"]
