"""``histospec bench verify-cost``: a table written on the tiny model, readable by the replay, and its errors."""

from __future__ import annotations

import json

import pytest

from sglang_histospec.cli import main
from sglang_histospec.drafting.verify_cost import VerifyCostTable
from tests.helpers.tiny import make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GRID = ["--batches", "1,4", "--rows", "1,2,4", "--repeats", "1", "--context", "16"]


@pytest.mark.parametrize("which", ["shape", "model"])
def test_writes_a_measured_table_the_replay_reads(tmp_path, capsys, which):
    source = ["--shape", "tiny"] if which == "shape" else ["--model", make_tiny_model_dir(tmp_path / "m")]
    out = tmp_path / "t" / "cpu.json"
    assert main(["bench", "verify-cost", "--device", "cpu", *source, *GRID, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    table = VerifyCostTable.load(out)
    assert summary["out"] == str(out) and summary["measured_cells"] == 6 and summary["skipped_cells"] == 0
    assert table.measured and table.label.startswith("measured: ") and sorted(table.ms) == [1, 4]
    assert table.meta["dtype"] == "float32" and table.meta["context"] == 16 and len(table.meta["cells"]) == 6
    assert table.cost(1, 4) == 1.0 and table.pass_ms(3, 2) > 0
    assert summary["ms"] == table.to_dict()["ms"]


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--shape", "70b", "--device", "cpu"], "model size '70b' is unknown"),
        (["--shape", "tiny", "--device", "tpu"], "--device 'tpu'"),
        (["--shape", "tiny", "--device", "cpu", "--dtype", "int8"], "--dtype 'int8'"),
        (["--shape", "tiny", "--device", "cpu", "--rows", "0,2"], r"--rows \[0, 2\]"),
    ],
)
def test_bad_flags_name_the_value(tmp_path, flags, match):
    with pytest.raises(SystemExit, match=match):
        main(["bench", "verify-cost", *flags, "--out", str(tmp_path / "x.json")])
