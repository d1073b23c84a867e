"""Multi-epoch rollouts of a tiny demo model through the embedded engine, and the trace they write."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_histospec.demo import model as demo_model
from sglang_histospec.demo.rollouts import RolloutConfig, epoch_requests, index_seed, request_seed, sample_epochs
from sglang_histospec.demo.task import ArithTask
from sglang_histospec.trace.format import load_steps
from tests.helpers.demo_tools import TINY


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return demo_model.build_or_load_demo_model(tmp_path_factory.mktemp("demo-cache"), config=TINY, progress=False)


def test_request_seed_is_stable_and_distinct():
    assert request_seed(0, 1, "arith-0001", 2) == request_seed(0, 1, "arith-0001", 2)
    seeds = {request_seed(0, e, f"arith-{p:04d}", k) for e in range(3) for p in range(4) for k in range(4)}
    assert len(seeds) == 48 and all(0 <= s < 2**31 for s in seeds)


PROMPTS = [("arith-0000", [5, 6]), ("arith-0001", [7])]


def test_epoch_requests_hash_seeding_is_the_demos():
    reqs = epoch_requests(PROMPTS, 2, 1.0, 8, 0, 1, return_logprob=True)
    assert [r.rid for r in reqs] == ["e1-arith-0000-0", "e1-arith-0000-1", "e1-arith-0001-0", "e1-arith-0001-1"]
    assert [r.sampling.seed for r in reqs] == [request_seed(0, 1, pid, k) for pid, _ in PROMPTS for k in range(2)]
    assert reqs[3].sampling.seed == 1137737926  # the traces of docs/data/ were sampled with these seeds
    assert all(r.return_logprob and r.sampling.max_new_tokens == 8 for r in reqs)
    assert [r.input_ids for r in reqs] == [[5, 6], [5, 6], [7], [7]] and reqs[2].prompt_id == "arith-0001"


def test_epoch_requests_index_seeding_is_the_benchmarks():
    reqs = epoch_requests(PROMPTS, 2, 1.0, 8, 2, 3, seeding="index")
    # seed * 1_000_003 + epoch * 10_007 + prompt index * 101 + sample: the seeds of docs/results.md's engine figures
    assert [r.sampling.seed for r in reqs] == [2030027, 2030028, 2030128, 2030129]
    assert index_seed(2, 3, 1, 2) == 2030130 and not any(r.return_logprob for r in reqs)
    assert [r.rid for r in reqs] == [r.rid.replace("e1-", "e3-") for r in epoch_requests(PROMPTS, 2, 1.0, 8, 0, 1)]


def test_epoch_requests_rejects_an_unknown_seeding():
    with pytest.raises(ValueError, match="seeding='sha'"):
        epoch_requests(PROMPTS, 1, 1.0, 8, 0, 0, seeding="sha")


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
