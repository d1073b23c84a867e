"""Durable drafter history: a write-ahead log of pushes and step ends, compacted into snapshots; no torch.

A change is acknowledged only after its log record is fsync'd, so a kill -9 loses nothing acknowledged
(:class:`DurableHistory`; record layout: ``history_scan``; docs/reliability.md). Example::

    store = DurableHistory("/tmp/h", DrafterConfig())     # ValueError if the directory cannot be written
    drafter = store.restore()                             # snapshot + log, or an empty drafter
    drafter.add("p", 3, [[5, 6]]); store.append({"op": "push", "step": 3, "entries": [...]})
    store.snapshot(drafter)                               # compaction
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import Any

from sglang_histospec.drafting.history_scan import (
    LOG_NAME,
    MAGIC,
    MAGIC_SIZE,
    SNAPSHOT_NAME,
    HistoryCorrupt,
    encode_record,
    fsync_dir,
    scan_log,
    snapshot_refusal,
)

logger = logging.getLogger(__name__)

NOT_SAVED = "history not saved"
"""How every message of a failed log write starts (the SGLang path maps it to HTTP 507 by it)."""

__all__ = ["LOG_NAME", "SNAPSHOT_NAME", "DurableHistory", "HistoryCorrupt", "HistoryLog", "HistoryWriteError"]


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` at the file's end and fsync (the one place bytes reach the disk; tests inject faults here)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.fsync(fd)


class HistoryLog:
    """An append-only, fsync'd, checksummed record log (layout: ``history_scan.MAGIC``).

    Opening never changes acknowledged records: :meth:`records` cuts only a torn tail (a crash mid-append) and
    raises :class:`HistoryCorrupt` for anything else that fails a check.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.version = 2
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(path, flags, 0o644)
        mode = os.fstat(self._fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(self._fd)
            raise ValueError(f"history log {path} is not a regular file")
        self._size = os.fstat(self._fd).st_size
        if self._size == 0:
            _write_all(self._fd, MAGIC)
            self._size = MAGIC_SIZE

    @property
    def size(self) -> int:
        """Bytes of the log (header included)."""
        return self._size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        """Every record as (seq, payload). A torn last record (never acknowledged) is cut off; a corrupt one
        raises :class:`HistoryCorrupt` (nothing is cut)."""
        with open(self.path, "rb") as f:
            data = f.read()
        if len(data) < MAGIC_SIZE and MAGIC.startswith(data):  # a crash while the log was being created
            os.ftruncate(self._fd, 0)
            _write_all(self._fd, MAGIC)
            data = MAGIC
        scan = scan_log(self.path, data)
        if scan.problem is not None:
            raise HistoryCorrupt(scan)
        if scan.torn_bytes:
            logger.warning("history log %s: cutting %d bytes of a torn last record", self.path, scan.torn_bytes)
            os.ftruncate(self._fd, scan.end)
            os.fsync(self._fd)
        self.version, self._size = scan.version, scan.end
        return scan.records

    def append(self, seq: int, record: dict[str, Any]) -> None:
        """Append one record durably; OSError if it could not be (the log is then as before)."""
        data = encode_record(seq, record, self.version)
        if self._size == 0:  # a reset that failed after emptying the file
            data = MAGIC + data
        try:
            _write_all(self._fd, data)
        except OSError:
            with contextlib.suppress(OSError):  # drop a partial record, so the next append starts clean
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def reset(self) -> None:
        """Empty the log (after a snapshot holds every record); it is written in the current format from then on."""
        if self.version == 2:
            os.ftruncate(self._fd, MAGIC_SIZE)
            os.fsync(self._fd)
        else:  # a format 1 log becomes format 2 (an empty file is a new log, should this fail half-way)
            os.ftruncate(self._fd, 0)
            self.version, self._size = 2, 0
            _write_all(self._fd, MAGIC)
        self._size = MAGIC_SIZE


class DurableHistory:
    """The drafter's history in ``directory``: ``history.snapshot`` plus ``history.wal``.

    ``problem`` says why the history is not being saved (a failed write), else None; it clears at the next
    successful write.

    Contract: a change is acknowledged only after its log record is written and fsync'd, so a kill -9 at any point
    loses nothing acknowledged. A snapshot (``drafting/snapshot.py``, atomic) records the sequence number of the last
    record it holds; the log is then emptied. Restore = snapshot, then every record with a larger sequence number
    (records already in the snapshot are skipped, so a crash between snapshot and truncation replays nothing twice).
    A torn last record (a crash mid-append: never acknowledged) is cut off at restore; any other damage refuses
    the restore (:class:`HistoryCorrupt`, naming the file, the byte offset and the repair command).
    """

    def __init__(self, directory: str, drafter_config: Any = None) -> None:
        self.directory = directory
        self.drafter_config = drafter_config
        self.snapshot_path = os.path.join(directory, SNAPSHOT_NAME)
        self.problem: str | None = None
        self._seq = 0
        try:
            os.makedirs(directory, exist_ok=True)
            if not os.path.isdir(directory):
                raise NotADirectoryError(f"{directory} is not a directory")
            probe = os.path.join(directory, f".write-probe.{os.getpid()}")
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, b"\0" * 4096)
            finally:
                os.close(fd)
                os.unlink(probe)
            self.log = HistoryLog(os.path.join(directory, LOG_NAME))
        except OSError as exc:
            raise ValueError(
                f"--history-dir {directory}: cannot write there ({type(exc).__name__}: {exc}); "
                "point it at a writable directory with free space, or leave it unset for in-memory history"
            ) from exc

    def restore(self) -> Any:
        """The drafter of the snapshot plus the log's later records (an empty drafter when there is neither).
        ValueError if the snapshot or log is corrupt (refuse to start rather than drop history)."""
        drafter, done = _from_snapshot(self.snapshot_path, self.drafter_config)
        self._seq = max(self._seq, _replay(drafter, self.log.records(), done), done)
        return drafter

    def append(self, record: dict[str, Any]) -> None:
        """Log one change durably; ``HistoryWriteError`` (an OSError) names the directory and cause otherwise."""
        try:
            self.log.append(self._seq + 1, record)
        except OSError as exc:
            self.problem = f"{NOT_SAVED}: cannot write {self.log.path} ({type(exc).__name__}: {exc})"
            raise HistoryWriteError(self.problem) from exc
        self._seq += 1
        self.problem = None

    def snapshot(self, drafter: Any) -> None:
        """Write the snapshot (holding every logged record), then empty the log. OSError on failure (the log
        still holds everything)."""
        try:
            drafter.snapshot(self.snapshot_path, extra={"log_seq": self._seq})
            fsync_dir(self.directory)
            self.log.reset()
        except OSError as exc:
            self.problem = f"history snapshot to {self.snapshot_path} failed ({type(exc).__name__}: {exc})"
            raise
        self.problem = None

    def close(self) -> None:
        self.log.close()


def read_history(directory: str, drafter_config: Any = None) -> Any:
    """The drafter a restore of ``directory`` gives, read only (a torn tail is skipped, not cut): for processes that
    follow a history another process writes. ValueError as :meth:`DurableHistory.restore`."""
    drafter, done = _from_snapshot(os.path.join(directory, SNAPSHOT_NAME), drafter_config)
    path = os.path.join(directory, LOG_NAME)
    if os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
        if len(data) >= MAGIC_SIZE:
            scan = scan_log(path, data)
            if scan.problem is not None:
                raise HistoryCorrupt(scan)
            _replay(drafter, scan.records, done)
    return drafter


def _from_snapshot(path: str, drafter_config: Any) -> tuple[Any, int]:
    """(drafter, seq of the last log record it holds) of the snapshot at ``path``; an empty drafter and -1 without."""
    from sglang_histospec.drafting.drafter import DrafterConfig, HistoSpecDrafter
    from sglang_histospec.drafting.snapshot import read_snapshot

    cfg = drafter_config or DrafterConfig()
    if not os.path.exists(path):
        return HistoSpecDrafter(cfg), -1
    try:
        state = read_snapshot(path)
    except ValueError as exc:
        raise ValueError(snapshot_refusal(path, exc)) from exc
    return HistoSpecDrafter.from_state(state, cfg), int(state.get("extra", {}).get("log_seq", -1))


def _replay(drafter: Any, records: list[tuple[int, dict[str, Any]]], done: int) -> int:
    """Apply the records after seq ``done``; returns the largest seq seen (-1 for none)."""
    last, replayed = -1, 0
    for seq, record in records:
        last = max(last, seq)
        if seq > done:
            apply_record(drafter, record)
            replayed += 1
    if replayed:
        logger.info("replayed %d history log records after the snapshot", replayed)
    return last


class HistoryWriteError(OSError):
    """A history change could not be made durable."""


def apply_record(drafter: Any, record: dict[str, Any]) -> None:
    """Apply one log record: ``{"op": "push", "step", "entries": [...]}`` or ``{"op": "end_step", "step"}``."""
    if record["op"] == "push":
        for e in record["entries"]:
            drafter.add(e["prompt_id"], record["step"], e["responses"], e.get("rewards"), e.get("prompt_tokens"))
    elif record["op"] == "end_step":
        drafter.end_step(record["step"])
    else:
        raise ValueError(f"history log record op={record['op']!r} is unknown")
