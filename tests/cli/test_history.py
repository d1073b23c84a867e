"""``histospec history check`` and ``histospec history repair`` (issue 44): exit status and report per state."""

from __future__ import annotations

import json
import os

import pytest

from sglang_histospec import cli
from sglang_histospec.drafting.drafter import DrafterConfig
from sglang_histospec.drafting.history_log import DurableHistory
from sglang_histospec.drafting.history_scan import LOG_NAME


def _history(directory: str, damage: str) -> None:
    store = DurableHistory(directory, DrafterConfig())
    store.restore()
    for step in range(2):
        store.append({"op": "push", "step": step, "entries": [{"prompt_id": "p", "responses": [[5, 6, 7]]}]})
    store.close()
    path = os.path.join(directory, LOG_NAME)
    with open(path, "r+b") as f:
        if damage == "torn":
            f.seek(0, os.SEEK_END)
            f.write(b"\x40\x00\x00")
        elif damage == "corrupt":
            f.seek(30)
            f.write(b"#")


CASES = [
    # damage, exit status of check, "ok", torn tail bytes, problem offset
    ("none", 0, True, 0, None),
    ("torn", 0, True, 3, None),
    ("corrupt", 1, False, 0, 8),
]


@pytest.mark.parametrize(("damage", "status", "ok", "torn", "bad_at"), CASES, ids=[c[0] for c in CASES])
def test_check_json(tmp_path, capsys, damage, status, ok, torn, bad_at) -> None:
    directory = str(tmp_path)
    _history(directory, damage)
    log = tmp_path / LOG_NAME
    before = log.read_bytes()
    assert cli.main(["history", "check", directory, "--json"]) == status
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is ok and report["log"]["torn_tail_bytes"] == torn
    assert (report["log"]["problem"] is None) == (bad_at is None)
    if bad_at is not None:
        assert report["log"]["end"] == bad_at
    assert log.read_bytes() == before  # check changes nothing


def test_repair_writes_a_backup_then_the_server_starts(tmp_path, capsys) -> None:
    directory = str(tmp_path)
    _history(directory, "corrupt")
    assert cli.main(["history", "repair", directory, "--drop-from", "9"]) == 2
    assert "not a record start" in capsys.readouterr().err
    assert cli.main(["history", "repair", directory, "--drop-from", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert os.path.exists(out["backup"]) and out["dropped_bytes"] > 0
    assert cli.main(["history", "check", directory]) == 0
    assert "ok" in capsys.readouterr().out
    DurableHistory(directory, DrafterConfig()).restore()


def test_check_of_a_missing_directory_is_exit_2(tmp_path, capsys) -> None:
    assert cli.main(["history", "check", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
