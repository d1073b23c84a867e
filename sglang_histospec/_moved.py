"""Old import paths of modules that moved (issue 14), kept importable for one release.

``import sglang_histospec.core.drafter`` (or ``sglang_histospec.peers.suffix``, ``sglang_histospec.replay_drafters``)
gives the module at its new place, ``sglang_histospec.drafting.drafter``, the same object, with a
``DeprecationWarning``. ``install()`` (called by the package ``__init__``) adds the import hook that does it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

PACKAGE = "sglang_histospec"
MOVED = {
    "core.types": "drafting.types",
    "core.reference": "drafting.reference",
    "core.native": "drafting.native",
    "core.drafter": "drafting.drafter",
    "core.budget": "drafting.budget",
    "core.snapshot": "drafting.snapshot",
    "core.pack": "drafting.pack",
    "core.verifycost": "drafting.verify_cost",
    "core.stepcost": "drafting.draft_cut",
    "core.bench_index": "drafting.index_bench",
    "core.kgrams": "trace.kgrams",
    "core.trace": "trace.format",
    "core.synth": "trace.synth",
    "core.trace_stats": "trace.stats",
    "core.lengths": "pipe.lengths",
    "core.planner": "pipe.planner",
    "core.costmodel": "pipe.worker_cost",
    "core.pipesim": "pipe.simulator",
    "core.workersim": "pipe.worker_sim",
    "core.migration": "pipe.migration",
    "core.timeline": "pipe.timeline",
    "core.replay": "replay.simulator",
    "core.histospec_replay": "replay.drafters.histospec",
    "core.prompt_lookup": "replay.drafters.prompt_lookup",
    "core.history_log": "drafting.history_log",
    "server.history_log": "drafting.history_log",
    "peers.sglang_ngram": "replay.drafters.sglang_ngram",
    "peers.suffix": "replay.drafters.suffix",
    "replay_drafters": "replay.drafters.registry",
}
"""Old module path (under ``sglang_histospec``) -> its new one."""


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    """The ``DeprecationWarning`` for a use of ``{PACKAGE}.old``, which is now ``{PACKAGE}.new``."""
    warnings.warn(
        f"{PACKAGE}.{old} moved to {PACKAGE}.{new}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the module at the new path."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix(PACKAGE + ".")
        if old == fullname or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        old = spec.name.removeprefix(PACKAGE + ".")
        warn_moved(old, MOVED[old], stacklevel=8)
        return importlib.import_module(f"{PACKAGE}.{MOVED[old]}")

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ``create_module`` returned the (already imported) new module."""


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once: it claims only the old paths, ahead of any finder (an
    editable install's, say) that could resolve them to a stale copy."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
