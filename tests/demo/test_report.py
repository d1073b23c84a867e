"""The demo's side-by-side report: epoch pairing, table, speedup, plots and the summary contract."""

from __future__ import annotations

import json

import pytest

from sglang_histospec.demo.report import compare_epochs, format_table, rollout_speedup, summary, write_plots
from sglang_histospec.demo.rollouts import EpochStats


def stats(epoch, mode, reward, tokens, verify, drafted, accepted, seconds):
    return EpochStats(epoch, mode, 8, reward, tokens, verify, drafted, accepted, seconds)


HS = [stats(0, "HISTOSPEC", 0.25, 100, 100, 0, 0, 4.0), stats(1, "HISTOSPEC", 0.5, 120, 60, 90, 60, 2.0)]
OFF = [stats(0, "NONE", 0.25, 100, 100, 0, 0, 4.0), stats(1, "NONE", 0.375, 110, 110, 0, 0, 5.0)]


def test_compare_epochs_pairs_runs_and_derives_tau_acceptance_speedup():
    rows = compare_epochs(HS, OFF)
    assert [r.epoch for r in rows] == [0, 1]
    assert rows[1].tau == 2.0 and rows[1].accept_rate == pytest.approx(60 / 90)
    assert rows[0].speedup == 1.0 and rows[1].speedup == 2.5
    assert rollout_speedup(rows) == 2.5  # the first epoch (no history) is left out
    assert rollout_speedup(rows, skip_first=False) == pytest.approx(9.0 / 6.0)
    assert rollout_speedup(rows[:1]) == 1.0
    with pytest.raises(ValueError, match="epochs differ"):
        compare_epochs(HS, OFF[:1])


def test_table_has_one_line_per_epoch_with_the_figures():
    lines = format_table(compare_epochs(HS, OFF)).splitlines()
    assert len(lines) == 4 and "speedup" in lines[0]
    assert lines[3].split() == ["1", "0.500", "0.375", "2.00", "0.67", "2.00", "5.00", "2.50"]


def test_summary_has_the_contract_keys_and_is_json(tmp_path):
    rows = compare_epochs(HS, OFF)
    out = summary(rows, "t.jsonl.gz", policy="grpo")
    for key in ("epochs", "reward_first", "reward_last", "tau_last", "rollout_speedup", "trace"):
        assert key in out
    assert (out["epochs"], out["reward_first"], out["reward_last"], out["tau_last"]) == (2, 0.25, 0.5, 2.0)
    assert out["policy"] == "grpo" and len(out["per_epoch"]) == 2 and out["per_epoch"][1]["speedup"] == 2.5
    assert json.loads(json.dumps(out)) == out
    with pytest.raises(ValueError, match="no epochs"):
        summary([], "t")


def test_plots_are_png_files(tmp_path):
    paths = write_plots(compare_epochs(HS, OFF), tmp_path / "plots")
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["rewards.png", "rollout.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
