"""Reading the history write-ahead log without changing it: record layout, a scan that tells a torn tail from
corruption, the operator's report (``histospec history check``) and repair (``histospec history repair``).

A torn tail (the last record's header is incomplete, or its checked header declares more bytes than the file
holds) is a crash mid-append, never acknowledged: the log may cut it. Anything else that fails a check (a checksum,
a header, JSON) is corruption of acknowledged data: the server refuses to start (:class:`HistoryCorrupt`) and only
``repair_log`` with an offset the operator chose removes records. Example::

    scan = scan_log("h/history.wal", open("h/history.wal", "rb").read())
    scan.problem        # None, or "record at byte 8 (seq 1) fails its payload checksum"
    scan.boundaries     # record starts: the offsets ``repair_log`` accepts
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

MAGIC_V1 = b"HSPWAL\x00\x01"
"""Format 1: ``<length u32> <payload crc32 u32> <seq u64> <payload>``; nothing checks the length or the seq."""
MAGIC = b"HSPWAL\x00\x02"
"""Format 2 (written now): ``<length u32> <seq u64> <payload crc32 u32> <header crc32 u32> <payload>``; the header
checksum covers length and seq, so a damaged length is never taken for a torn tail."""
MAGIC_SIZE = len(MAGIC)
HEADER_V1 = struct.Struct("<IIQ")
HEADER = struct.Struct("<IQII")
SNAPSHOT_NAME = "history.snapshot"
LOG_NAME = "history.wal"


def fsync_dir(path: str) -> None:
    """Make a rename or a new file in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_record(seq: int, record: dict[str, Any], version: int = 2) -> bytes:
    """One log record in format ``version``. Example: ``encode_record(1, {"op": "end_step", "step": 0})``."""
    payload = json.dumps(record, separators=(",", ":")).encode()
    if version == 1:
        return HEADER_V1.pack(len(payload), zlib.crc32(payload), seq) + payload
    head = struct.pack("<IQI", len(payload), seq, zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


@dataclass(slots=True)
class LogScan:
    """What a log holds: its intact records, where they start, a torn tail, or the first corruption."""

    path: str
    size: int
    version: int
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """(seq, payload) of every intact record before ``end``."""
    offsets: list[int] = field(default_factory=list)
    """Byte offset of each record of ``records``."""
    end: int = MAGIC_SIZE
    """End of the last intact record: where a torn tail or the corruption starts."""
    problem: str | None = None
    """Why the bytes at ``end`` are corrupt (not a torn tail), else None."""

    @property
    def torn_bytes(self) -> int:
        """Bytes of a torn last record after ``end`` (0 when the log ends cleanly or is corrupt)."""
        return 0 if self.problem else self.size - self.end

    @property
    def boundaries(self) -> list[int]:
        """Offsets a repair may drop from: every record start, and ``end``."""
        return [*self.offsets, self.end]


class HistoryCorrupt(ValueError):
    """A history log holds a corrupt record: the server refuses to start rather than drop what follows."""

    def __init__(self, scan: LogScan) -> None:
        self.scan = scan
        directory = os.path.dirname(scan.path) or "."
        super().__init__(
            f"history log {scan.path}: {scan.problem} ({scan.size - scan.end} bytes from byte {scan.end} on); "
            "refusing to start rather than drop acknowledged history. Inspect: "
            f"`histospec history check {directory}`; to drop byte {scan.end} on (a backup is written first): "
            f"`histospec history repair {directory} --drop-from {scan.end}`"
        )


def scan_log(path: str, data: bytes) -> LogScan:
    """Scan the bytes ``data`` of the log at ``path``; ValueError if it is not a histospec log (bad magic)."""
    magic = data[:MAGIC_SIZE]
    if magic not in (MAGIC, MAGIC_V1):
        raise ValueError(
            f"history log {path}: not a histospec log (bad magic at byte 0); inspect it with "
            f"`histospec history check {os.path.dirname(path) or '.'}`, or move it away to start empty"
        )
    scan = LogScan(path, len(data), 2 if magic == MAGIC else 1)
    pos = MAGIC_SIZE
    while pos < len(data):
        seq, record, problem, next_pos = _read_one(data, pos, scan.version)
        if problem is not None:
            scan.problem = problem
            break
        if record is None:  # a torn tail
            break
        scan.records.append((seq, record))
        scan.offsets.append(pos)
        pos = next_pos
    scan.end = pos
    return scan


def _read_one(data: bytes, pos: int, version: int) -> tuple[int, dict | None, str | None, int]:
    """(seq, record, problem, next offset) of the record at ``pos``; record None and no problem: a torn tail."""
    header = HEADER if version == 2 else HEADER_V1
    if len(data) - pos < header.size:
        return 0, None, None, pos
    if version == 2:
        length, seq, crc, head_crc = header.unpack_from(data, pos)
        if zlib.crc32(data[pos : pos + 16]) != head_crc:
            return 0, None, f"record header at byte {pos} fails its checksum", pos
    else:
        length, crc, seq = header.unpack_from(data, pos)
    start = pos + header.size
    payload = data[start : start + length]
    if len(payload) < length:
        if version == 1 and zlib.crc32(payload) == crc:  # complete payload, damaged length: not torn
            return 0, None, f"record at byte {pos} declares {length} payload bytes but is complete", pos
        return 0, None, None, pos
    if zlib.crc32(payload) != crc:
        return 0, None, f"record at byte {pos} (seq {seq}) fails its payload checksum", pos
    try:
        record = json.loads(payload)
    except ValueError:
        record = None
    if not isinstance(record, dict) or "op" not in record:
        return 0, None, f"record at byte {pos} (seq {seq}) is not a history record", pos
    return seq, record, None, start + length


def snapshot_refusal(path: str, exc: Exception) -> str:
    """Why a start refuses the snapshot at ``path`` that failed to read with ``exc``, and what to do."""
    directory = os.path.dirname(path) or "."
    return (
        f"history snapshot {path} cannot be restored ({exc}); refusing to start rather than drop history. "
        f"Inspect: `histospec history check {directory}`; move it away to start from the log alone"
    )


def refusal(directory: str) -> str | None:
    """What a restore of ``directory`` would refuse (the message it would give), or None; reads only.

    Example: ``refusal("h")`` is None for an intact (or torn-tailed) history.
    """
    from sglang_histospec.drafting.snapshot import read_snapshot

    snap_path = os.path.join(directory, SNAPSHOT_NAME)
    if os.path.exists(snap_path):
        try:
            read_snapshot(snap_path)
        except ValueError as exc:
            return snapshot_refusal(snap_path, exc)
    log_path = os.path.join(directory, LOG_NAME)
    if not os.path.exists(log_path):
        return None
    with open(log_path, "rb") as f:
        data = f.read()
    if len(data) < MAGIC_SIZE and MAGIC.startswith(data):
        return None
    try:
        scan = scan_log(log_path, data)
    except ValueError as exc:
        return str(exc)
    return None if scan.problem is None else str(HistoryCorrupt(scan))


def check_directory(directory: str) -> dict[str, Any]:
    """The report of ``histospec history check``: snapshot and log state, and whether a server would start.

    Example: ``check_directory("h")["ok"]`` is False when the log holds a corrupt record; ``["log"]["repair"]``
    is then the command that drops it and everything after it.
    """
    from sglang_histospec.drafting.snapshot import read_snapshot

    report: dict[str, Any] = {"directory": directory, "ok": True, "snapshot": None, "log": None}
    snap_path = os.path.join(directory, SNAPSHOT_NAME)
    if os.path.exists(snap_path):
        try:
            state = read_snapshot(snap_path)
            report["snapshot"] = {"path": snap_path, "ok": True, "log_seq": state.get("extra", {}).get("log_seq")}
        except ValueError as exc:
            report["snapshot"] = {"path": snap_path, "ok": False, "problem": str(exc)}
            report["ok"] = False
    log_path = os.path.join(directory, LOG_NAME)
    if os.path.exists(log_path):
        report["log"] = _log_report(log_path)
        report["ok"] = report["ok"] and report["log"]["problem"] is None
    return report


def _log_report(log_path: str) -> dict[str, Any]:
    with open(log_path, "rb") as f:
        data = f.read()
    try:
        scan = scan_log(log_path, data)
    except ValueError as exc:
        return {"path": log_path, "size": len(data), "problem": str(exc), "records": 0}
    seqs = [seq for seq, _ in scan.records]
    out: dict[str, Any] = {
        "path": log_path,
        "size": scan.size,
        "format": scan.version,
        "records": len(scan.records),
        "first_seq": seqs[0] if seqs else None,
        "last_seq": seqs[-1] if seqs else None,
        "end": scan.end,
        "torn_tail_bytes": scan.torn_bytes,
        "problem": scan.problem,
        "boundaries": scan.boundaries,
    }
    if scan.problem:
        directory = os.path.dirname(log_path) or "."
        out["repair"] = f"histospec history repair {directory} --drop-from {scan.end}"
    return out


@dataclass(slots=True)
class RepairResult:
    """What ``repair_log`` did: the backup it wrote and what it dropped."""

    backup: str
    dropped_records: int
    dropped_bytes: int


def repair_log(directory: str, drop_from: int) -> RepairResult:
    """Copy the log to a backup (fsync'd), then cut it at ``drop_from``, a record start (``LogScan.boundaries``).

    Example: ``repair_log("h", 8)`` empties the log of ``h`` after writing ``h/history.wal.bak.<time>``.
    """
    log_path = os.path.join(directory, LOG_NAME)
    if not os.path.isfile(log_path):
        raise ValueError(f"{log_path}: no history log there; check the directory")
    with open(log_path, "rb") as f:
        data = f.read()
    scan = scan_log(log_path, data)
    if drop_from not in scan.boundaries:
        raise ValueError(
            f"--drop-from {drop_from}: not a record start of {log_path}; choose one of {scan.boundaries} "
            f"(`histospec history check {directory}` lists them)"
        )
    backup = f"{log_path}.bak.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.{os.getpid()}"
    shutil.copyfile(log_path, backup)
    with open(backup, "rb+") as f:
        os.fsync(f.fileno())
    fsync_dir(directory)
    with open(log_path, "rb+") as f:
        f.truncate(drop_from)
        os.fsync(f.fileno())
    dropped = sum(1 for off in scan.offsets if off >= drop_from)
    return RepairResult(backup=backup, dropped_records=dropped, dropped_bytes=len(data) - drop_from)
