"""Exact offline replay of a drafter on a recorded trace, with the oracle bound (docs/replay.md)."""

from sglang_histospec.replay.drafters import DRAFTERS, PeerUnavailable, build_drafter
from sglang_histospec.replay.simulator import (
    BaseDrafter,
    NoneDrafter,
    Oracle,
    ReplayConfig,
    ReplayDrafter,
    ReplayResult,
    replay,
)

__all__ = [
    "DRAFTERS",
    "BaseDrafter",
    "NoneDrafter",
    "Oracle",
    "PeerUnavailable",
    "ReplayConfig",
    "ReplayDrafter",
    "ReplayResult",
    "build_drafter",
    "replay",
]
