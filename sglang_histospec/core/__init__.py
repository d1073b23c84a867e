"""Pure core: history index, drafter and budgets, HistoPipe planner, trace format and replay.

Nothing here imports an engine, a server, SGLang or TRL.
"""

from sglang_histospec.core.types import ROOT, Draft

__all__ = ["ROOT", "Draft"]
