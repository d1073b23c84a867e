"""Multi-epoch rollouts of a tiny demo model through the embedded engine, and the trace they write."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_histospec.demo.rollouts import RolloutConfig, sample_epochs
from sglang_histospec.models import demo_model
from sglang_histospec.tasks.arith import ArithTask
from sglang_histospec.trace.format import load_steps
from tests.helpers.demo_tools import TINY


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return demo_model.build_or_load_demo_model(tmp_path_factory.mktemp("demo-cache"), config=TINY, progress=False)


@pytest.mark.parametrize(
    "kwargs, match", [({"epochs": 0}, "epochs"), ({"group_size": 0}, "group_size"), ({"num_prompts": 0}, "num_p")]
)
def test_rollout_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**kwargs)


def test_epochs_write_a_trace_and_histospec_drafts_from_history(tiny_model, tmp_path, monkeypatch):
    from sglang_histospec.engine.governor import SpecGovernor

    # this tests recording and drafting from history, not whether drafting pays: no explore budget in 2 short epochs
    monkeypatch.setattr(SpecGovernor, "within_budget", lambda self, bsz=None: True)
    task = ArithTask(TINY.task)
    cfg = RolloutConfig(epochs=2, group_size=3, num_prompts=4, max_new_tokens=24, max_running_requests=8)
    trace = tmp_path / "run.jsonl.gz"
    spec = sample_epochs(tiny_model, task, cfg, "HISTOSPEC", trace_path=trace, progress=False)
    plain = sample_epochs(tiny_model, task, dataclasses.replace(cfg, epochs=1), "NONE", progress=False)

    assert [s.epoch for s in spec] == [0, 1] and all(s.responses == 12 for s in spec)
    assert plain[0].tau == 1.0 and plain[0].drafted == 0
    assert spec[1].drafted > 0 and spec[1].tau >= 1.0  # epoch 1 drafts from epoch 0's responses
    assert spec[1].accepted <= spec[1].drafted

    steps, was_sorted = load_steps(trace)
    assert was_sorted and [s.step for s in steps] == [0, 1]
    tok = demo_model.build_tokenizer()
    for st, stats in zip(steps, spec):
        assert len(st.records) == 12
        assert sum(len(r.response) for r in st.records) == stats.tokens
        for rec in st.records:
            prompt = task.prompt(rec.prompt_id)
            assert rec.prompt == tok(prompt.text).input_ids and rec.epoch == rec.step
            assert rec.reward == task.reward(prompt.text, tok.decode(rec.response, skip_special_tokens=True))
        assert stats.mean_reward == pytest.approx(sum(r.reward for r in st.records) / 12)
    assert {(r.prompt_id, r.sample) for r in steps[0].records} == {
        (p.prompt_id, k) for p in task.prompts[:4] for k in range(3)
    }
