"""The real-LLM demo's logic on tiny models: chat tasks as GRPO tasks, the cached warm-up, the side-by-side report,
and one GRPO run whose every rollout is replayed on a plain-decoding server (``histospec demo`` end to end)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_histospec.demo.chat_demo import (
    WARMUP,
    ChatTask,
    demo_family,
    demo_run_config,
    warmed_policy,
    warmup_key,
    warmup_meta,
)
from sglang_histospec.demo.report import format_table, side_by_side_epochs, summary
from sglang_histospec.demo.rollouts import EpochStats
from sglang_histospec.tasks.chat import make_family
from sglang_histospec.trace.record import RecordConfig
from tests.helpers.tiny import make_tiny_model_dir

CHAT_TEMPLATE = (
    "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)
TINY_WARMUP = RecordConfig(family="arith", num_prompts=4, warmup_examples=4, warmup_epochs=1, train_layers=1,
                           micro_batch=2)  # fmt: skip


def chat_model_dir(path: Path) -> str:
    """A tiny random Llama whose char tokenizer has a chat template (the shape of a real chat model's directory)."""
    from transformers import AutoTokenizer

    out = make_tiny_model_dir(path, vocab_size=96)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return chat_model_dir(tmp_path_factory.mktemp("chat-model"))


def test_chat_task_renders_prompts_with_the_template_and_scores_by_prompt_id(chat_model: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    family = make_family("arith", num_prompts=3, seed=0)
    task = ChatTask(family, tok)
    rows = task.rows()
    assert [r["prompt_id"] for r in rows] == [p.prompt_id for p in family.prompts]
    assert rows[0]["prompt"].startswith("Q: Start with") and rows[0]["prompt"].endswith("A: ")
    right = f"Step 1: ...\nAnswer: {family.prompts[1].answer}"
    rewards = task.reward_func(
        ["ignored"] * 3, [right, right, "no answer line"], prompt_id=[r["prompt_id"] for r in rows]
    )
    assert rewards == [0.1, 1.0, 0.0]  # the same text is right for prompt 1 only
    with pytest.raises(ValueError, match="prompt_id"):
        task.reward_func(["p"], [right])
    with pytest.raises(ValueError, match="not in the 'arith' prompt set"):
        task.reward_func(["p"], [right], prompt_id=["sort-0000"])


def test_demo_family_refuses_the_held_out_family_and_run_configs_fit_whole_steps() -> None:
    with pytest.raises(ValueError, match="held out"):
        demo_family("units", 4)
    assert demo_family("sort", 4).name == "sort"
    quick, full = demo_run_config(quick=True), demo_run_config()
    assert quick.side_by_side and full.side_by_side
    assert (quick.epochs, quick.steps_per_epoch) == (2, 1) and (full.epochs, full.steps_per_epoch) == (4, 1)
    assert demo_run_config(epochs=3).epochs == 3 and full.train_layers == WARMUP.train_layers
    assert quick.max_running_requests == full.max_running_requests == 4  # where drafting can pay on a CPU


def test_warm_up_is_trained_once_and_cached(chat_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang_histospec.demo.chat_demo as chat_demo

    first = warmed_policy(chat_model, TINY_WARMUP, tmp_path, progress=False)
    assert first.parent == tmp_path / "demo-policies" and (first / "config.json").is_file()
    meta = warmup_meta(first)
    assert meta is not None and meta["config"]["warmup_examples"] == 4 and meta["seconds"] > 0

    def no_training(*a: object, **k: object) -> float:
        raise AssertionError("a cached warm-up was trained again")

    monkeypatch.setattr(chat_demo, "_warm_up", no_training)
    assert warmed_policy(chat_model, TINY_WARMUP, tmp_path, progress=False) == first
    other = RecordConfig(**{**TINY_WARMUP.__dict__, "warmup_lr": 1e-3})
    assert warmup_key(chat_model, other) != warmup_key(chat_model, TINY_WARMUP)  # another recipe, another entry
    untouched = RecordConfig(**{**TINY_WARMUP.__dict__, "warmup_examples": 0})
    assert warmed_policy(chat_model, untouched, tmp_path) == Path(chat_model) and warmup_meta(chat_model) is None


def test_demo_command_refuses_settings_of_the_toy_on_a_real_model(tmp_path: Path) -> None:
    from sglang_histospec import cli

    with pytest.raises(SystemExit, match="only with --model tiny"):
        cli.main(["demo", "--policy", "frozen", "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="held out"):
        cli.main(["demo", "--model", str(tmp_path), "--family", "units", "--out-dir", str(tmp_path)])


def replayed(epoch: int, seconds: float, plain_seconds: float, identical: int) -> EpochStats:
    return EpochStats(epoch, "HISTOSPEC", 8, 0.5, 200, 100, 150, 100, seconds, nll=50.0, plain_seconds=plain_seconds,
                      plain_tokens=200, plain_reward=0.5, identical=identical)  # fmt: skip


def test_side_by_side_rows_report_tokens_per_second_speedup_entropy_and_identity() -> None:
    rows = side_by_side_epochs([replayed(0, 4.0, 4.0, 8), replayed(1, 2.0, 5.0, 7)])
    assert rows[1].speedup == 2.5 and rows[1].tokens_per_s_histospec == 100.0 and rows[1].tokens_per_s_plain == 40.0
    assert rows[1].entropy == 0.25 and rows[1].identical == 7 / 8 and rows[1].tau == 2.0
    lines = format_table(rows).splitlines()
    assert "tok/s HS" in lines[0] and lines[3].split()[-3:] == ["100.0", "40.0", "0.250"]
    out = summary(rows, "t.jsonl.gz")
    assert out["rollout_speedup"] == 2.5 and out["per_epoch"][1]["tokens_per_s_plain"] == 40.0
    with pytest.raises(ValueError, match="side_by_side=True"):
        side_by_side_epochs([EpochStats(0, "HISTOSPEC", 8, 0.5, 10, 10, 0, 0, 1.0)])


def test_demo_command_on_a_tiny_chat_model_end_to_end(chat_model: str, tmp_path: Path, trl_env: None,
                                                      monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    """``histospec demo --model DIR --quick``: warm-up, one GRPO run, every rollout replayed without HistoSpec."""
    import dataclasses

    import sglang_histospec.demo.chat_demo as chat_demo
    from sglang_histospec import cli
    from sglang_histospec.trace.format import load_steps

    monkeypatch.setattr(chat_demo, "WARMUP", dataclasses.replace(TINY_WARMUP, num_prompts=16))
    quick = dataclasses.replace(demo_run_config(quick=True), max_new_tokens=12, train_layers=1)
    monkeypatch.setattr(chat_demo, "demo_run_config", lambda *a, **k: dataclasses.replace(quick, epochs=2))
    out_dir = tmp_path / "out"
    code = cli.main(["demo", "--model", chat_model, "--quick", "--out-dir", str(out_dir), "--cache-dir",
                     str(tmp_path / "cache"), "--no-progress", "--json", "--max-running-requests", "3"])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["config"]["max_running_requests"] == 3
    assert out["epochs"] == 2 and out["family"] == "arith" and Path(out["model_dir"]).parent.name == "demo-policies"
    assert out["identical_responses"] == out["responses"] == 32  # seeded alike: the plain replay is token-identical
    for row in out["per_epoch"]:
        assert row["reward_plain"] == row["reward_histospec"] and row["tokens_plain"] == row["tokens_histospec"]
        assert row["rollout_s_plain"] > 0 and row["rollout_s_histospec"] > 0 and row["entropy"] > 0
        assert row["speedup"] == pytest.approx(row["rollout_s_plain"] / row["rollout_s_histospec"])
    assert json.loads((out_dir / "summary.json").read_text()) == out
    assert all(Path(p).is_file() for p in out["plots"])
    steps, _ = load_steps(out["trace"])
    assert [s.step for s in steps] == [0, 1] and all(len(s.records) == 16 for s in steps)


@pytest.mark.slow
def test_quick_demo_on_smollm2(tmp_path: Path, trl_env: None, capsys) -> None:
    """``histospec demo --quick`` on the real model (prepared and warmed up once, then cached; minutes on a CPU)."""
    from sglang_histospec import cli
    from sglang_histospec.models.prepare import resolve_model

    try:
        resolve_model("smollm2-135m-instruct", progress=False)
    except ValueError as exc:  # the weights' package is not installed here
        pytest.skip(str(exc))
    code = cli.main(["demo", "--quick", "--out-dir", str(tmp_path), "--no-progress", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["model"] == "smollm2-135m-instruct" and out["epochs"] == 2
    assert out["identical_responses"] == out["responses"] == 32
    for row in out["per_epoch"]:
        assert 0.0 <= row["reward_histospec"] == row["reward_plain"] <= 1.0
        assert row["tau"] >= 1.0 and row["entropy"] > 0 and row["tokens_per_s_plain"] > 0


def test_the_plain_replay_runs_beside_the_rollout_and_reports_its_own_time_and_errors() -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sglang_histospec.demo.grpo import _timed

    started = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        timed = pool.submit(_timed, lambda: started.wait(5) and 4)  # runs while this thread goes on
        started.set()
        value, seconds = timed.result()
        assert value == 4 and 0.0 <= seconds < 5.0
        with pytest.raises(ZeroDivisionError):
            pool.submit(_timed, lambda: 1 / 0).result()
