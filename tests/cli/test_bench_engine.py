"""The figures of `histospec bench engine` from its per-epoch measurements (pure: no engine, no model)."""

from __future__ import annotations

import pytest

from sglang_histospec.commands.bench_engine import _epoch_row, _speeds


def _info(cpu_s: float, accepted: int, drafted: int, forwards: int) -> dict:
    return {"cpu_s": cpu_s, "tau": 1.5, "accepted": accepted, "drafted": drafted, "forwards": forwards,
            "ms_per_forward": 2.0 * forwards}  # fmt: skip


def test_epoch_row_divides_tokens_by_seconds_and_drops_a_missing_hf_run():
    row = _epoch_row(3, (2.0, 100, _info(4.0, 6, 8, 10)), (5.0, 100, _info(10.0, 0, 0, 20)), (0, 0, 0))
    assert row["epoch"] == 3 and row["tokens_per_s_histospec"] == 50.0 and row["tokens_per_s_plain"] == 20.0
    assert row["cpu_tokens_per_s_histospec"] == 25.0 and row["cpu_tokens_per_s_plain"] == 10.0
    assert row["tokens_per_s_hf_generate"] is None and row["cpu_tokens_per_s_hf_generate"] is None
    assert row["accept_rate"] == 0.75 and row["forwards_plain"] == 20 and row["ms_per_forward_histospec"] == 20.0
    hf = _epoch_row(0, (2.0, 100, _info(4.0, 0, 0, 1)), (5.0, 100, _info(10.0, 0, 0, 1)), (4.0, 80, 8.0))
    assert hf["tokens_per_s_hf_generate"] == 20.0 and hf["cpu_tokens_per_s_hf_generate"] == 10.0
    assert hf["accept_rate"] == 0.0  # nothing drafted


def test_speeds_are_medians_of_the_measured_epochs_and_the_minimum_counts_the_cold_one():
    rows = [
        _epoch_row(e, (1.0, s, _info(1.0, 1, 2, 4)), (1.0, 100, _info(2.0, 0, 0, 4)), (0, 0, 0))
        for e, s in enumerate([50, 300, 200, 250])
    ]
    out = _speeds(rows)
    assert out["tokens_per_s_histospec"] == 250 and out["tokens_per_s_plain"] == 100
    assert out["speedup"] == 2.5 and out["speedup_cold"] == 0.5 and out["speedup_min"] == 0.5
    assert out["cpu_speedup"] == pytest.approx(5.0) and out["step_cost_ratio"] == 1.0
    assert out["tokens_per_s_hf_generate"] is None and out["tau"] == 1.5 and out["accept_rate"] == 0.5
    assert "plain_aa_ratio_min" not in out  # no second plain engine (--aa)


def test_speeds_report_the_range_of_the_plain_a_a_ratios_when_measured():
    rows = [
        _epoch_row(e, (1.0, 100, _info(1.0, 0, 0, 4)), (1.0, 100, _info(1.0, 0, 0, 4)), (0, 0, 0)) for e in range(3)
    ]
    for row, aa in zip(rows, [1.04, 0.97, 1.01]):
        row["plain_aa_ratio"] = aa
    out = _speeds(rows)
    assert out["plain_aa_ratio_min"] == 0.97 and out["plain_aa_ratio_max"] == 1.04  # the cold epoch counts
