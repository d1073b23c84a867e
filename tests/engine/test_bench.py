"""`histospec bench engine` runs end to end on a tiny model and prints its JSON contract (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from sglang_histospec import cli
from tests.helpers.engine_tools import torch_threads
from tests.helpers.tiny import make_tiny_model_dir


def test_bench_engine_json_contract(tmp_path, capsys):
    path = make_tiny_model_dir(tmp_path / "m", arch="llama", vocab_size=96, seed=0)
    argv = ["bench", "engine", "--model", path, "--epochs", "2", "--num-prompts", "3", "--group-size", "2"]
    argv += ["--batch", "4", "--max-new-tokens", "6", "--json"]
    with torch_threads(1):
        assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("tokens_per_s_histospec", "tokens_per_s_plain", "tokens_per_s_hf_generate", "speedup", "tau", "batch"):
        assert key in out, key
    assert out["batch"] == 4 and out["epochs_measured"] == 1 and out["tau"] >= 1.0
    assert out["tokens_per_s_histospec"] > 0 and out["tokens_per_s_plain"] > 0 and out["tokens_per_s_hf_generate"] > 0
    assert out["step_cost_ratio"] > 0 and out["requests_per_epoch"] == 6
    assert out["mean_token_entropy"] > 0  # a random tiny model samples at high entropy
    row = out["per_epoch"][1]
    assert row["forwards_histospec"] > 0 and row["forwards_plain"] > 0
    ratios = [r["tokens_per_s_histospec"] / r["tokens_per_s_plain"] for r in out["per_epoch"]]
    assert out["speedup_cold"] == ratios[0] and out["speedup_min"] == min(ratios)  # epoch 0 (cold) included


def test_bench_engine_batch_sweep(tmp_path, capsys):
    path = make_tiny_model_dir(tmp_path / "m", arch="llama", vocab_size=96, seed=0)
    argv = ["bench", "engine", "--model", path, "--epochs", "2", "--num-prompts", "2", "--group-size", "2"]
    argv += ["--batch", "1,3", "--max-new-tokens", "4", "--no-hf", "--aa", "--json"]
    with torch_threads(1):
        assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["batch"] for r in out["sweep"]] == [1, 3]
    for r in out["sweep"]:  # a second plain engine: the A/A ratio of each epoch (--aa)
        assert all(e["plain_aa_ratio"] > 0 for e in r["per_epoch"]) and r["plain_aa_ratio_min"] > 0
    assert out["speedup_min"] == min(r["speedup_min"] for r in out["sweep"])
    with pytest.raises(SystemExit, match="comma list"):
        cli.main(argv[:-5] + ["--batch", "1,x", "--json"])


def test_bench_engine_demo_model_choices():
    from sglang_histospec.commands import bench_engine
    from sglang_histospec.models.demo_model import DEMO_MODELS, DemoModelConfig

    parser = cli.build_parser()
    args = parser.parse_args(["bench", "engine", "--demo-model", "grpo"])
    assert args.demo_model == "grpo" and DEMO_MODELS["grpo"] == DemoModelConfig()
    assert parser.parse_args(["bench", "engine"]).demo_model == "converged"
    assert DEMO_MODELS["converged"].target_reward > DemoModelConfig().target_reward
    assert bench_engine.COMMAND == ("bench", "engine")


def test_bench_engine_on_a_chat_task_family(tmp_path, capsys):
    path = make_tiny_model_dir(tmp_path / "m", arch="llama", vocab_size=96, seed=0)
    argv = ["bench", "engine", "--model", path, "--task", "units", "--epochs", "2", "--num-prompts", "2"]
    argv += ["--group-size", "2", "--batch", "2", "--max-new-tokens", "4", "--no-hf", "--sequential", "--json"]
    with torch_threads(1):
        assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["requests_per_epoch"] == 4 and out["tokens_per_s_plain"] > 0
