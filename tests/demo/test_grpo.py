"""The demo's GRPO runs (HistoSpecGRPOTrainer + rollout server subprocess) and ``histospec demo`` end to end.

Slow: each run starts a server subprocess and trains a tiny model for a few steps.
"""

from __future__ import annotations

import json

import pytest
import trl  # noqa: F401  (a hard test dependency: `make test` installs it; missing, it must fail)

from sglang_histospec.demo.grpo import GRPORunConfig, run_grpo, trainer_available
from sglang_histospec.models import demo_model
from sglang_histospec.tasks.arith import ArithTask
from sglang_histospec.trace.format import load_steps
from tests.helpers.demo_tools import TINY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return demo_model.build_or_load_demo_model(tmp_path_factory.mktemp("demo-cache"), config=TINY, progress=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"group_size": 1}, "group_size"),
        ({"num_prompts": 6, "prompts_per_step": 4}, "multiple"),
        ({"epochs": 0}, "ep"),
        ({"max_running_requests": 0}, "max_running_requests"),
    ],
)
def test_grpo_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPORunConfig(**kwargs)


def test_grpo_with_and_without_histospec_writes_trace_and_epoch_stats(tiny_model, tmp_path):
    assert trainer_available() is None
    task = ArithTask(TINY.task)
    cfg = GRPORunConfig(epochs=2, num_prompts=4, group_size=2, prompts_per_step=2, max_new_tokens=16)
    trace = tmp_path / "grpo.jsonl.gz"
    spec = run_grpo(tiny_model, task, cfg, "HISTOSPEC", tmp_path / "on", trace_path=trace, progress=False)
    plain = run_grpo(tiny_model, task, cfg, "NONE", tmp_path / "off", progress=False)
    assert [s.epoch for s in spec] == [s.epoch for s in plain] == [0, 1]
    assert all(s.responses == 8 and s.seconds > 0 and s.tokens > 0 for s in spec + plain)
    assert all(s.tau == 1.0 and s.drafted == 0 for s in plain)
    assert spec[1].drafted > 0  # the second epoch drafts from the first epoch's pushed history
    server_stats = json.loads((tmp_path / "on" / "server-stats.json").read_text())  # why steps decoded plainly
    assert {"governed_plain_steps", "budget_plain_steps"} <= set(
        server_stats["backend"]["engine"]["step_cost"]["governor"]
    )

    steps, was_sorted = load_steps(trace)
    assert was_sorted and [s.step for s in steps] == [0, 1, 2, 3]
    for st in steps:
        assert len(st.records) == 4 and {r.epoch for r in st.records} == {st.step // 2}
        assert sorted(r.sample for r in st.records) == [0, 0, 1, 1]
    rewards = [r.reward for st in steps for r in st.records]
    assert spec[0].mean_reward == pytest.approx(sum(rewards[:8]) / 8)


def test_demo_command_frozen_policy_end_to_end(tiny_model, tmp_path, monkeypatch, capsys):
    """``histospec demo --quick --policy frozen --json`` with the quick model replaced by the tiny one."""
    from sglang_histospec import cli

    monkeypatch.setattr(demo_model, "QUICK_CONFIG", TINY)
    cache = tiny_model.parent.parent
    code = cli.main(["demo", "--model", "tiny", "--quick", "--policy", "frozen", "--epochs", "2", "--out-dir", str(tmp_path / "out"),
                     "--cache-dir", str(cache), "--no-progress", "--json"])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["epochs"] == 2 and out["policy"] == "frozen" and out["tau_last"] >= 1.0
    assert out["model_dir"] == str(tiny_model)
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == out
    steps, _ = load_steps(out["trace"])
    assert [s.step for s in steps] == [0, 1]
