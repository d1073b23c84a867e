"""TRL integration: ``HistoSpecGRPOTrainer`` (a drop-in ``GRPOTrainer`` generating on HistoSpec rollout servers),
its config, and ``make_rollout_func`` for TRL's ``rollout_func`` hook.

TRL is imported only when one of these names is first used, so ``import trl_integration`` stays light.

Example::

    from trl_integration import HistoSpecGRPOConfig, HistoSpecGRPOTrainer
    args = HistoSpecGRPOConfig(output_dir="out", rollout_urls=["http://127.0.0.1:30000"])
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "HistoSpecGRPOConfig": "trl_integration.config",
    "HistoSpecGRPOTrainer": "trl_integration.trainer",
    "make_rollout_func": "trl_integration.rollout",
    "RolloutServers": "trl_integration.servers",
    "RolloutServerUnreachable": "trl_integration.servers",
    "TokenizerMismatch": "trl_integration.servers",
    "stable_prompt_id": "trl_integration.prompt_ids",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trl_integration' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
