"""The SGLang worker's durable history: the torch server's store (``drafting/history_log.py``) driven from the
scheduler loop; pure Python, no SGLang import.

The directory comes from ``$HISTOSPEC_HISTORY_DIR`` (``histospec serve --backend sglang --history-dir DIR`` and
``python -m sglang_histospec.server.sglang_backend --histospec-history-dir DIR`` set it; with a plain ``sglang
serve`` set it yourself). TP rank 0 owns the directory: it restores (cutting a torn tail), logs every push and step
end before the RPC is answered, and compacts into a snapshot at each step end and once the log passes
``snapshot_log_bytes``. Other ranks restore the same state read only and apply the same calls. Example::

    store = WorkerHistory(WorkerHistoryConfig(directory="/tmp/h"), tp_rank=0, drafter_config=DrafterConfig())
    drafter = store.restore()
    drafter.add("p", 3, [[5, 6]]); store.log({"op": "push", "step": 3, "entries": [...]}, drafter)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_histospec.drafting.drafter import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.history_log import DurableHistory, read_history

logger = logging.getLogger(__name__)

HISTORY_DIR_ENV = "HISTOSPEC_HISTORY_DIR"
"""The worker's history directory; unset = history in memory only (lost when the server stops)."""


@dataclass(slots=True)
class WorkerHistoryConfig:
    """Where and how often the SGLang worker saves its history."""

    directory: str | None = None
    """History directory (log + snapshot); None = in memory only."""
    snapshot_log_bytes: int = 64 * 2**20
    """Compact into a snapshot once the log holds more than this (and at every step end)."""

    def __post_init__(self) -> None:
        if self.snapshot_log_bytes < 1:
            raise ValueError(f"WorkerHistoryConfig.snapshot_log_bytes={self.snapshot_log_bytes!r}: must be >= 1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerHistoryConfig:
        """``directory`` from ``$HISTOSPEC_HISTORY_DIR`` (empty = None)."""
        raw = (os.environ if environ is None else environ).get(HISTORY_DIR_ENV, "").strip()
        return cls(directory=raw or None)


class WorkerHistory:
    """One TP rank's view of the durable history (module docstring). Without a directory every call is a no-op."""

    def __init__(self, config: WorkerHistoryConfig, tp_rank: int, drafter_config: DrafterConfig) -> None:
        self.config, self.tp_rank, self.drafter_config = config, tp_rank, drafter_config
        self.store: DurableHistory | None = None
        if config.directory is not None and tp_rank == 0:
            self.store = DurableHistory(config.directory, drafter_config)  # ValueError: not writable

    def restore(self) -> HistoSpecDrafter:
        """The saved drafter (an empty one without a directory); ValueError if the history is corrupt."""
        if self.config.directory is None:
            return HistoSpecDrafter(self.drafter_config)
        if self.store is None:
            return read_history(self.config.directory, self.drafter_config)
        drafter = self.store.restore()
        logger.info("HISTOSPEC history restored from %s: %s", self.config.directory, drafter.stats())
        return drafter

    def log(self, record: dict[str, Any], drafter: HistoSpecDrafter) -> None:
        """Make an applied change durable (``HistoryWriteError`` if not); compact when the log grew large."""
        if self.store is None:
            return
        self.store.append(record)
        if self.store.log.size > self.config.snapshot_log_bytes:
            self.compact(drafter)

    def compact(self, drafter: HistoSpecDrafter) -> None:
        """Snapshot (it holds every logged change and the responses recorded so far), then empty the log. A failure
        is logged, not raised: the log still holds every acknowledged change."""
        if self.store is None:
            return
        try:
            self.store.snapshot(drafter)
        except OSError:
            logger.exception("HISTOSPEC history snapshot failed: %s", self.store.problem)

    @property
    def problem(self) -> str | None:
        """Why the history is not being saved, else None."""
        return None if self.store is None else self.store.problem
