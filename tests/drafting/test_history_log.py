"""The history write-ahead log and snapshots under damage (issue 44): a torn tail is cut, anything else refuses the
restore with the file, the offset and the repair command; fault injection over every byte of a small log and
snapshot never restores less than was acknowledged."""

from __future__ import annotations

import os
import struct

import pytest

from sglang_histospec.drafting.drafter import DrafterConfig
from sglang_histospec.drafting.history_log import DurableHistory, HistoryCorrupt
from sglang_histospec.drafting.history_scan import (
    LOG_NAME,
    MAGIC_SIZE,
    MAGIC_V1,
    SNAPSHOT_NAME,
    check_directory,
    encode_record,
    repair_log,
    scan_log,
)

STEPS = 3


def _push(step: int) -> dict:
    return {"op": "push", "step": step, "entries": [{"prompt_id": f"p{step}", "responses": [[5, 6, step + 7]]}]}


def _write_history(directory: str, snapshot_after: int | None = None) -> None:
    """Acknowledge ``STEPS`` pushes and step ends; a snapshot after push ``snapshot_after``."""
    store = DurableHistory(directory, DrafterConfig())
    drafter = store.restore()
    for step in range(STEPS):
        record = _push(step)
        drafter.add(f"p{step}", step, record["entries"][0]["responses"])
        store.append(record)
        drafter.end_step(step)
        store.append({"op": "end_step", "step": step})
        if step == snapshot_after:
            store.snapshot(drafter)
    store.close()


def _restore(directory: str):
    return DurableHistory(directory, DrafterConfig()).restore()


def _has_everything(drafter) -> bool:
    return all(drafter.has_visit(f"p{s}", s) for s in range(STEPS)) and drafter.open_step == STEPS


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _put(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("snapshot_after", [None, 0], ids=["log-only", "snapshot-and-log"])
def test_bit_flip_at_every_offset_recovers_everything_or_refuses(tmp_path, snapshot_after) -> None:
    """Every single-bit flip of the log and the snapshot: the restore holds every acknowledged record, or it is
    refused with a ValueError; it never holds less."""
    directory = str(tmp_path / "h")
    _write_history(directory, snapshot_after)
    for name in (LOG_NAME, SNAPSHOT_NAME):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        clean = _bytes(path)
        refused = 0
        for offset in range(len(clean)):
            damaged = bytearray(clean)
            damaged[offset] ^= 1 << (offset % 8)
            _put(path, bytes(damaged))
            try:
                drafter = _restore(directory)
            except ValueError:
                refused += 1
                assert _bytes(path) == bytes(damaged), f"{name} byte {offset}: the evidence was changed"
                continue
            assert _has_everything(drafter), f"{name}: a flip at byte {offset} silently lost acknowledged history"
        _put(path, clean)
        assert refused > 0


def test_short_write_at_every_length_keeps_every_acknowledged_record(tmp_path) -> None:
    """A crash while appending one more record, stopped after k bytes for every k: the acknowledged records are all
    restored, the partial one is cut, and the log takes new records after it."""
    directory = str(tmp_path / "h")
    _write_history(directory)
    path = os.path.join(directory, LOG_NAME)
    clean = _bytes(path)
    last = scan_log(path, clean).records[-1][0]
    extra = encode_record(last + 1, _push(STEPS))
    for k in range(len(extra)):
        _put(path, clean + extra[:k])
        store = DurableHistory(directory, DrafterConfig())
        drafter = store.restore()
        assert _has_everything(drafter) and not drafter.has_visit(f"p{STEPS}", STEPS), k
        assert _bytes(path) == clean, f"a torn tail of {k} bytes was not cut"
        store.append(_push(STEPS))
        store.close()
        assert _restore(directory).has_visit(f"p{STEPS}", STEPS)


def _flip(path: str, offset: int) -> None:
    data = bytearray(_bytes(path))
    data[offset] ^= 0x40
    _put(path, bytes(data))


CORRUPTIONS = [
    # (what, offset of the damage from the record start, which record) -> refused at that record's start
    ("payload of the first record, more follow", 25, 0),
    ("header of a middle record", 2, 2),
    ("payload of the complete last record", 25, -1),
    ("declared length of the last record", 1, -1),
    ("seq of the last record", 6, -1),
]


@pytest.mark.parametrize(("what", "delta", "index"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupt_record_refuses_restore_naming_file_offset_and_repair(tmp_path, what, delta, index) -> None:
    directory = str(tmp_path / "h")
    _write_history(directory)
    path = os.path.join(directory, LOG_NAME)
    start = scan_log(path, _bytes(path)).offsets[index]
    _flip(path, start + delta)
    before = _bytes(path)
    with pytest.raises(HistoryCorrupt) as info:
        _restore(directory)
    message = str(info.value)
    assert path in message and f"byte {start}" in message
    assert f"histospec history repair {directory} --drop-from {start}" in message
    assert _bytes(path) == before  # nothing cut: the evidence stays


def test_check_reports_and_repair_drops_only_from_the_chosen_record_with_a_backup(tmp_path) -> None:
    directory = str(tmp_path / "h")
    _write_history(directory)
    path = os.path.join(directory, LOG_NAME)
    scan = scan_log(path, _bytes(path))
    bad = scan.offsets[4]  # push of step 2
    _flip(path, bad + 25)
    report = check_directory(directory)
    assert not report["ok"] and report["log"]["end"] == bad and report["log"]["records"] == 4
    assert report["log"]["repair"].endswith(f"--drop-from {bad}")
    damaged = _bytes(path)
    with pytest.raises(ValueError, match="not a record start"):
        repair_log(directory, bad + 1)
    result = repair_log(directory, bad)
    assert _bytes(result.backup) == damaged
    assert result.dropped_bytes == len(damaged) - bad
    drafter = _restore(directory)
    assert drafter.has_visit("p1", 1) and not drafter.has_visit("p2", 2)
    assert check_directory(directory)["ok"]


def test_format_1_log_is_read_and_a_complete_record_with_a_bad_length_is_refused(tmp_path) -> None:
    """Logs written before format 2 restore; a damaged length there is told from a torn tail by its checksum."""
    directory = tmp_path / "h"
    directory.mkdir()
    records = [_push(0), {"op": "end_step", "step": 0}]
    body = b"".join(encode_record(i + 1, r, version=1) for i, r in enumerate(records))
    path = str(directory / LOG_NAME)
    _put(path, MAGIC_V1 + body)
    store = DurableHistory(str(directory), DrafterConfig())
    drafter = store.restore()
    assert drafter.has_visit("p0", 0) and drafter.open_step == 1
    store.close()
    last = MAGIC_SIZE + len(encode_record(1, records[0], version=1))
    length = struct.unpack_from("<I", _bytes(path), last)[0]
    data = bytearray(_bytes(path))
    struct.pack_into("<I", data, last, length + 100)
    _put(path, bytes(data))
    with pytest.raises(HistoryCorrupt, match=f"byte {last}"):
        _restore(str(directory))


def test_format_1_log_becomes_format_2_at_the_first_snapshot(tmp_path) -> None:
    directory = str(tmp_path / "h")
    os.makedirs(directory)
    _put(os.path.join(directory, LOG_NAME), MAGIC_V1 + encode_record(1, _push(0), version=1))
    store = DurableHistory(directory, DrafterConfig())
    drafter = store.restore()
    store.snapshot(drafter)
    store.append({"op": "end_step", "step": 0})
    store.close()
    scan = scan_log(os.path.join(directory, LOG_NAME), _bytes(os.path.join(directory, LOG_NAME)))
    assert scan.version == 2 and scan.records[0][0] == 2
    assert _restore(directory).open_step == 1


def test_failed_append_at_every_length_leaves_the_log_as_before(tmp_path, monkeypatch) -> None:
    """An append whose write fails after k bytes (disk full) raises, is not acknowledged, and leaves the log as it
    was, so the next append and a restore see every acknowledged record."""
    directory = str(tmp_path / "h")
    _write_history(directory)
    path = os.path.join(directory, LOG_NAME)
    clean = _bytes(path)
    size = len(encode_record(99, _push(STEPS)))
    real_write = os.write
    store = DurableHistory(directory, DrafterConfig())
    store.restore()
    for k in range(0, size, 7):

        def short_write(fd: int, data, k=k) -> int:
            real_write(fd, bytes(data[:k]))
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "write", short_write)
        with pytest.raises(OSError):
            store.append(_push(STEPS))
        monkeypatch.setattr(os, "write", real_write)
        assert _bytes(path) == clean, k
    store.append(_push(STEPS))
    store.close()
    drafter = _restore(directory)
    assert _has_everything(drafter) and drafter.has_visit(f"p{STEPS}", STEPS)


def test_snapshot_cut_short_at_every_length_is_refused(tmp_path) -> None:
    """Snapshots are renamed into place whole; one cut short anyway is refused, never restored as less."""
    directory = str(tmp_path / "h")
    _write_history(directory, snapshot_after=STEPS - 1)
    path = os.path.join(directory, SNAPSHOT_NAME)
    clean = _bytes(path)
    for k in range(0, len(clean), 3):
        _put(path, clean[:k])
        with pytest.raises(ValueError, match="history check"):
            _restore(directory)
    _put(path, clean)
    assert _has_everything(_restore(directory))
