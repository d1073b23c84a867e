"""engine/verify_table.py: timing the cells of a verify-cost table and turning them into the file format."""

from __future__ import annotations

import statistics

import pytest
import torch

from sglang_histospec.drafting.verify_cost import VerifyCostTable
from sglang_histospec.engine import verify_table as vt
from sglang_histospec.engine.model import TreeForward
from sglang_histospec.models.shapes import SHAPES, random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def fwd():
    return TreeForward(random_model("tiny"))


def _cells(fwd, budget_s=300.0, **overrides):
    cfg = vt.VerifyTimingConfig(**{"batches": [1, 4], "rows": [1, 2, 4], "repeats": 2, "context": 16, **overrides})
    return vt.time_cells(fwd, cfg, vt.Deadline(budget_s))


def test_every_cell_is_timed_in_grid_order_with_its_median(fwd):
    seen = []
    cfg = vt.VerifyTimingConfig(batches=[4, 1], rows=[2, 1], repeats=3, context=16)
    cells = vt.time_cells(fwd, cfg, vt.Deadline(300.0), on_cell=lambda c: seen.append(len(c)))
    assert [(c["batch"], c["rows"]) for c in cells] == [(1, 1), (1, 2), (4, 1), (4, 2)]  # sorted, as the table
    assert seen[:4] == [1, 2, 3, 4] and set(seen[4:]) <= {4}  # then any cell timed again
    for c in cells:  # a cell slower than one with more rows is timed once more (tiny passes are all alike)
        assert c["status"] == "ok" and len(c["times_ms"]) == 3 * (2 if c.get("retimed") else 1)
        assert c["median_ms"] == pytest.approx(statistics.median(c["times_ms"]), abs=1e-4) and c["median_ms"] > 0


def test_a_spent_budget_skips_every_cell_with_the_reason(fwd):
    cells = _cells(fwd, budget_s=-1.0)
    assert len(cells) == 6
    assert all(c["status"] == "skipped" and c["reason"].startswith("time budget") for c in cells)


def test_a_cache_that_would_not_fit_skips_its_cells_with_the_figures(fwd):
    cells = _cells(fwd, batches=[256], rows=[1, 2], context=10**9)
    assert [c["status"] for c in cells] == ["skipped", "skipped"]
    assert all(c["reason"].startswith("KV cache") and "GiB > 0.9 x free" in c["reason"] for c in cells)


def test_an_out_of_memory_pass_is_recorded_and_the_next_cell_runs(fwd, monkeypatch):
    real, calls = vt.timed_passes, []

    def first_runs_out(*args):  # a CPU cannot run out of device memory on demand
        calls.append(args)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(*args)

    monkeypatch.setattr(vt, "timed_passes", first_runs_out)
    cells = _cells(fwd, batches=[1], rows=[1, 2], repeats=1)
    assert [c["status"] for c in cells] == ["oom", "ok"]
    assert cells[0]["reason"].startswith("out of memory: CUDA out of memory")


def test_a_cell_slower_than_one_with_more_rows_is_timed_again(fwd, monkeypatch):
    passes = iter([[0.009], [0.002], [0.003], [0.001, 0.001]])  # rows 1, 2, 4; then rows 1 once more
    monkeypatch.setattr(vt, "timed_passes", lambda *args: next(passes))
    cells = _cells(fwd, batches=[1], rows=[1, 2, 4], repeats=1)
    assert [c["median_ms"] for c in cells] == [1.0, 2.0, 3.0]  # the median of 9, 1 and 1 ms
    assert cells[0]["retimed"] and cells[0]["times_ms"] == [9.0, 1.0, 1.0] and "retimed" not in cells[1]


@pytest.mark.parametrize(
    "medians, expected",
    [
        ({(1, 1): 9.0, (1, 2): 2.0, (1, 4): 3.0}, [0]),
        ({(1, 1): 1.0, (1, 2): 2.0, (4, 1): 1.5}, []),  # another batch is not compared
        ({(1, 1): 3.0, (1, 2): 2.0, (1, 4): 1.0}, [0, 1]),
        ({(1, 1): 2.0, (1, 2): 2.0}, []),
        ({(1, 1): 2.1, (1, 2): 2.0}, []),  # within the slack
    ],
)
def test_out_of_order(medians, expected):
    assert vt.out_of_order([_ok(b, r, ms) for (b, r), ms in medians.items()]) == expected


def _ok(batch, rows, ms):
    return {"batch": batch, "rows": rows, "status": "ok", "median_ms": ms, "times_ms": [ms]}


def test_measured_table_keeps_absolute_times_non_decreasing_and_the_cells():
    cells = [_ok(1, 1, 2.0), _ok(1, 2, 1.9), _ok(1, 4, 3.0), _ok(8, 1, 4.0), _ok(8, 4, 8.0),
             {"batch": 8, "rows": 8, "status": "skipped", "reason": "time budget"}]  # fmt: skip
    table = vt.measured_table(cells, "measured: x", {"device": "cpu"})
    assert table.ms == {1: ([1, 2, 4], [2.0, 2.0, 3.0]), 8: ([1, 4], [4.0, 8.0])}
    assert table.measured and table.meta["cells"] == cells and table.meta["device"] == "cpu"
    assert table.cost(4, 8) == 2.0 and table.pass_ms(2, 8) == pytest.approx(16 / 3)
    again = VerifyCostTable.from_dict(table.to_dict())
    assert again.ms == table.ms and again.batches == table.batches and again.measured


def test_measured_table_without_a_measured_cell_says_why():
    with pytest.raises(ValueError, match="no cell was measured .*time budget"):
        vt.measured_table([{"batch": 1, "rows": 1, "status": "skipped", "reason": "time budget"}], "x", {})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rows": [0, 1]}, r"--rows \[0, 1\]"),
        ({"batches": []}, r"--batches \[\]"),
        ({"repeats": 0}, "--repeats 0"),
        ({"context": -1}, "--context -1"),
    ],
)
def test_bad_timing_config_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vt.VerifyTimingConfig(**kwargs)


def test_byte_estimates_read_a_models_config():
    tiny = SHAPES["tiny"]  # 2 layers, 2 KV heads of 16
    assert vt.cache_bytes(tiny, batch=3, tokens=10, elt=4) == 2 * 2 * 3 * 2 * 10 * 16 * 4
    assert vt.pass_bytes(tiny, 8, 4, 512, 4) > vt.pass_bytes(tiny, 8, 2, 512, 4) > 0
