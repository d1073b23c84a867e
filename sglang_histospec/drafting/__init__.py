"""History drafting: the per-prompt history index (native and reference), the drafter, budgets, the cost-aware
cut, snapshots, the shared draft types and the prompt-id rule. Pure: imports no engine, server, SGLang or TRL.
"""

from sglang_histospec.drafting.budget import BudgetConfig, BudgetController
from sglang_histospec.drafting.calibration import CalibrationConfig, DraftCalibration
from sglang_histospec.drafting.draft_cut import StepCostModel, best_cut
from sglang_histospec.drafting.drafter import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.pack import PackedDraft, pack_draft
from sglang_histospec.drafting.prompt_ids import prompt_id_for, token_prompt_id
from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.drafting.types import ROOT, AcceptanceRates, Draft
from sglang_histospec.drafting.verify_cost import VerifyCostTable

__all__ = [
    "ROOT",
    "AcceptanceRates",
    "BudgetConfig",
    "BudgetController",
    "CalibrationConfig",
    "Draft",
    "DraftCalibration",
    "Drafter",
    "DrafterConfig",
    "HistoSpecDrafter",
    "PackedDraft",
    "StepCostModel",
    "VerifyCostTable",
    "best_cut",
    "pack_draft",
    "prompt_id_for",
    "token_prompt_id",
]
