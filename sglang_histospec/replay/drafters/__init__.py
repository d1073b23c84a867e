"""Every drafter ``histospec replay`` can run, by name: ours (``histospec``, ``rhymerl``), ``prompt-lookup``,
``none`` and the peers ``sglang-ngram`` and ``suffix`` (optional packages, imported lazily).
"""

from sglang_histospec.replay.drafters.peers import PeerUnavailable
from sglang_histospec.replay.drafters.registry import DRAFTERS, add_drafter_arguments, build_drafter, drafter_options

__all__ = [
    "DRAFTERS",
    "PeerUnavailable",
    "add_drafter_arguments",
    "build_drafter",
    "drafter_options",
]
