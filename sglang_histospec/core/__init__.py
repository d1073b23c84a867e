"""Pure core: history index, drafter and budgets, HistoPipe planner, trace format and replay.

Nothing here imports an engine, a server, SGLang or TRL.
"""

from sglang_histospec.core.budget import BudgetConfig, BudgetController
from sglang_histospec.core.drafter import DrafterConfig, HistoSpecDrafter
from sglang_histospec.core.pack import PackedDraft, pack_draft
from sglang_histospec.core.types import ROOT, Draft

__all__ = [
    "ROOT",
    "BudgetConfig",
    "BudgetController",
    "Draft",
    "DrafterConfig",
    "HistoSpecDrafter",
    "PackedDraft",
    "pack_draft",
]
