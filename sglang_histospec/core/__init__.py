"""Deprecated package: its modules moved to ``drafting``, ``pipe``, ``trace``, ``replay`` and ``server``.

``sglang_histospec.core.X`` and the names this package exported still import, with a ``DeprecationWarning``, for
one release (``sglang_histospec._moved``; the new layout is in docs/architecture.md). The compiled history index
``_native`` still lives here (setup.py builds ``sglang_histospec.core._native``).
"""

from __future__ import annotations

import importlib

from sglang_histospec._moved import warn_moved

_EXPORTS = {
    "BudgetConfig": "budget",
    "BudgetController": "budget",
    "DrafterConfig": "drafter",
    "HistoSpecDrafter": "drafter",
    "PackedDraft": "pack",
    "pack_draft": "pack",
    "ROOT": "types",
    "Draft": "types",
}
"""Names ``sglang_histospec.core`` exported -> their module in ``sglang_histospec.drafting``."""


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"core.{name}", f"drafting.{name}")
    value = getattr(importlib.import_module(f"sglang_histospec.drafting.{_EXPORTS[name]}"), name)
    globals()[name] = value  # warn once
    return value
