"""scripts/gpu_check.py: its CPU path end to end (the JSON's shape, greedy identity), and its parts on their own."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_histospec.drafting.verify_cost import VerifyCostTable

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gc_mod = _load()


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "gpu_check.json"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--sizes", "tiny", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_cpu_path_writes_every_section(cpu_run):
    data, stdout = cpu_run
    assert {"config", "env", "greedy", "gpu_tests", "forward", "projection", "seconds"} <= set(data)
    assert data["config"]["dtype"] == "float32" and data["env"]["device"] == "cpu"
    assert data["env"]["drafter_backend"] in ("native", "python")
    assert "greedy identity float32: IDENTICAL" in stdout


def test_cpu_path_greedy_tokens_are_identical_and_history_drafts_are_accepted(cpu_run):
    [greedy] = cpu_run[0]["greedy"]
    assert greedy["dtype"] == "float32" and greedy["identical"] is True
    first, second = greedy["rounds"]
    assert first["identical"] == first["requests"] == second["identical"] == second["requests"]
    assert second["accepted"] > 0 and second["tau"] > 1.0  # the second round drafts from the first's responses


def test_cpu_path_times_every_cell(cpu_run):
    data = cpu_run[0]
    cells = data["forward"]["tiny"]["cells"]
    assert [(c["batch"], c["rows"]) for c in cells] == [
        (b, r) for b in data["config"]["batches"] for r in data["config"]["rows"]
    ]
    for cell in cells:  # a cell slower than one with more rows is timed once more (engine/verify_table.py)
        repeats = data["config"]["repeats"] * (2 if cell.get("retimed") else 1)
        assert cell["status"] == "ok" and len(cell["times_ms"]) == repeats
        assert cell["median_ms"] == pytest.approx(statistics.median(cell["times_ms"]), abs=1e-4)


def test_cpu_path_runs_the_gpu_marked_tests(cpu_run):
    tests = cpu_run[0]["gpu_tests"]
    assert {"tests/plugin/test_gpu.py", "tests/trl/test_distributed_sync.py"} <= set(tests["files"])
    assert tests["tests"] and all(t["outcome"] == "skipped" for t in tests["tests"])  # no CUDA here


def test_cpu_path_projects_every_committed_trace(cpu_run):
    data = cpu_run[0]
    proj = data["projection"]
    assert proj["label"].startswith("PROJECTION")
    traces = {str(p.relative_to(ROOT)) for p in ROOT.glob(gc_mod.TRACES)}
    assert {row["trace"] for row in proj["rows"]} == traces
    t = {(c["batch"], c["rows"]): c["median_ms"] for c in data["forward"]["tiny"]["cells"]}
    for row in (r for r in proj["rows"] if r["tau"] is not None):
        assert row["t1_ms"] == t[(row["batch"], 1)]
        assert row["projected_speedup"] == pytest.approx(
            row["tau"] * row["t1_ms"] / row["tk_ms"], abs=1e-3
        )  # rounded to 3 places


@pytest.mark.parametrize(
    "points, rows, expected",
    [
        ({1: 1.0, 2: 1.5, 4: 2.5}, 1, 1.0),
        ({1: 1.0, 2: 1.5, 4: 2.5}, 3, 2.0),  # between measured rows
        ({1: 1.0, 2: 1.5, 4: 2.5}, 4, 2.5),
        ({1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5}, 9, 5.0),  # just past the last, along its last segment
        ({1: 1.0, 2: 1.5, 4: 2.5}, 5, None),  # too far past it
        ({1: 1.0}, 1, 1.0),
        ({1: 1.0}, 2, None),
        ({2: 1.0, 4: 2.0}, 1, None),
    ],
)
def test_interpolate(points, rows, expected):
    assert gc_mod.interpolate(points, rows) == expected


def test_projection_uses_the_replayed_tau_and_lists_traces_without_one():
    forward = {"s": {"cells": [{"batch": 8, "rows": r, "status": "ok", "median_ms": float(r)} for r in (1, 4, 8)]}}
    some_trace = str(next(ROOT.glob(gc_mod.TRACES)).relative_to(ROOT))
    taus = {some_trace: {"file": "f.jsonl", "tau": {4: 3.0}}}
    rows = gc_mod.projection(forward, taus)["rows"]
    [row] = [r for r in rows if r["trace"] == some_trace]
    assert (row["budget"], row["tk_ms"], row["tk_from"], row["projected_speedup"]) == (4, 5.0, "interpolated", 0.6)
    assert all(r["tau"] is None for r in rows if r["trace"] != some_trace)


def test_replayed_tau_reads_the_default_drafters_rows():
    taus = gc_mod.replayed_tau()
    assert "docs/data/smollm2-arith.jsonl.gz" in taus
    assert sorted(taus["docs/data/smollm2-arith.jsonl.gz"]["tau"]) == [4, 8, 16, 32]


def test_junit_outcomes(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase classname="a" name="ok"/>'
        '<testcase classname="a" name="bad"><failure message="boom"/></testcase>'
        '<testcase classname="" name="b"><skipped message="no gpu"/></testcase>'
        '<testcase classname="c" name="d"><error message="ImportError"/></testcase></testsuite></testsuites>'
    )
    assert [(t["id"], t["outcome"], t["message"]) for t in gc_mod._junit_outcomes(xml)] == [
        ("a::ok", "passed", ""),
        ("a::bad", "failed", "boom"),
        ("b", "skipped", "no gpu"),
        ("c::d", "error", "ImportError"),
    ]


def test_a_spent_time_budget_skips_the_model_and_says_so(tmp_path):
    cfg = gc_mod.CheckConfig(device="cpu", sizes=["tiny"], out=str(tmp_path / "x.json"))
    report = gc_mod.Report(cfg.out)
    report.data["forward"] = {}
    result = gc_mod.time_forward(cfg, "tiny", gc_mod.Deadline(0.0), report)
    assert result["skipped"].startswith("time budget") and result["cells"] == []


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--device", "tpu"], "--device 'tpu'"),
        (["--device", "cpu", "--sizes", "tiny,70b"], "--sizes 70b unknown"),
        (["--device", "cpu", "--dtype", "int8"], "--dtype 'int8'"),
        (["--device", "cpu", "--rows", "0,1"], r"--rows \[0, 1\]"),
    ],
)
def test_bad_flags_name_the_value(flags, match):
    with pytest.raises(ValueError, match=match):
        gc_mod.parse_args(flags)


@pytest.mark.parametrize(
    "args, label, expected",
    [
        (("3",), None, 3),
        (("x",), {"dtype": "float32"}, {"dtype": "float32", "error": "ValueError: invalid literal"}),
    ],
)
def test_guarded_records_an_error_instead_of_raising(args, label, expected):
    got = gc_mod.guarded(int, *args, label=label)
    if isinstance(expected, int):
        assert got == expected
    else:
        assert got["dtype"] == expected["dtype"] and got["error"].startswith(expected["error"])
        assert got["traceback"][-1].startswith("ValueError")


def test_table_shows_a_failed_section():
    data = {
        "env": {"device": "cpu", "torch": "x", "drafter_backend": "python"},
        "config": {"dtype": "float32", "rows": [1, 2]},
        "greedy": [{"dtype": "bfloat16", "error": "RuntimeError: boom"}],
        "forward": {"8b": {"cells": [], "error": "RuntimeError: no kernel"}},
    }
    text = gc_mod.table(data)
    assert "greedy identity bfloat16: ERROR RuntimeError: boom" in text
    assert "8b    error: RuntimeError: no kernel" in text


def _tiny_forward(tmp_path, **overrides):
    cfg = gc_mod.CheckConfig(device="cpu", sizes=["tiny"], out=str(tmp_path / "x.json"), **overrides)
    report = gc_mod.Report(cfg.out)
    report.data["forward"] = {}
    return gc_mod.time_forward(cfg, "tiny", gc_mod.Deadline(300.0), report)


def test_each_size_writes_a_verify_cost_table_beside_the_report(tmp_path):
    result = _tiny_forward(tmp_path, batches=[1, 2], rows=[1, 2], repeats=1)
    table = VerifyCostTable.load(result["verify_cost_file"])
    assert result["verify_cost_file"] == str(tmp_path / "verify_cost_cpu_tiny.json")
    assert table.measured and table.meta["model"] == "shape tiny" and table.meta["cells"] == result["cells"]
    assert sorted(table.ms) == [1, 2] and table.cost(1, 2) == 1.0
