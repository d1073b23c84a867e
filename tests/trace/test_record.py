"""Trace recording (GRPO through the embedded engine) on a tiny model: trace contents, resume, the loss pieces."""

from __future__ import annotations

import pytest
import torch

from sglang_histospec.trace.format import read_trace
from sglang_histospec.trace.record import RecordConfig, grpo_rows, record_trace, token_logprobs, trainable_params
from tests.helpers.tiny import make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(num_prompts=2, group_size=2, max_new_tokens=6, warmup_examples=2, warmup_epochs=1, train_layers=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("rec") / "m", vocab_size=96)


@pytest.mark.parametrize(
    "rewards, expected",
    [([1.0, 0.0], [1.0, -1.0]), ([0.5, 0.5], []), ([1.0, 1.0, 0.0, 0.0], [1.0, 1.0, -1.0, -1.0])],
)
def test_grpo_rows_weights_are_group_normalised_advantages(rewards, expected):
    rows = grpo_rows({"p": [([1, 2], [3 + i], r) for i, r in enumerate(rewards)]})
    assert [round(w, 6) for _, _, w in rows] == expected
    assert all(start == 2 for _, start, _ in rows)


def test_token_logprobs_equal_a_full_forward(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    seqs, starts = [[1, 5, 6, 7, 8], [1, 9, 10]], [2, 1]
    got = token_logprobs(model, seqs, starts)
    want = []
    for s, st in zip(seqs, starts):
        lp = torch.log_softmax(model(torch.tensor([s])).logits[0].float(), -1)
        want += [lp[i - 1, s[i]] for i in range(st, len(s))]
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-5)


def test_trainable_params_are_the_top_layers_only(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    params = trainable_params(model, 1)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("model.layers.1.", "model.norm.")) for n in trained)
    assert len(params) == len(trained)
    with pytest.raises(ValueError, match="train_layers=3: the model has 2 layers"):
        trainable_params(model, 3)


def test_record_writes_every_response_and_a_resumed_run_equals_a_straight_one(model_dir, tmp_path):
    straight = record_trace(model_dir, RecordConfig(epochs=3, **SMALL), tmp_path / "a.jsonl.gz", tmp_path / "wa",
                            progress=False)  # fmt: skip
    record_trace(model_dir, RecordConfig(epochs=2, **SMALL), tmp_path / "b.jsonl.gz", tmp_path / "wb", progress=False)
    resumed = record_trace(model_dir, RecordConfig(epochs=3, **SMALL), tmp_path / "b.jsonl.gz", tmp_path / "wb",
                           progress=False)  # fmt: skip
    a, b = list(read_trace(tmp_path / "a.jsonl.gz")), list(read_trace(tmp_path / "b.jsonl.gz"))
    assert len(a) == 3 * 2 * 2 and [r.step for r in a] == sorted(r.step for r in a)
    assert (tmp_path / "wa" / "policy" / "config.json").is_file()  # the trained policy, loadable by the engine
    assert all(r.logprobs is not None and len(r.logprobs) == len(r.response) for r in a)  # the policy's, per token
    assert [(r.prompt_id, r.sample, r.response) for r in a] == [(r.prompt_id, r.sample, r.response) for r in b]
    assert [e.mean_reward for e in straight] == [e.mean_reward for e in resumed]
    with pytest.raises(ValueError, match="other settings"):
        record_trace(model_dir, RecordConfig(epochs=3, **{**SMALL, "group_size": 3}), tmp_path / "c.jsonl.gz",
                     tmp_path / "wb", progress=False)  # fmt: skip


def test_a_run_stopped_after_the_warm_up_resumes_without_warming_up_again(model_dir, tmp_path, monkeypatch):
    import shutil

    from sglang_histospec.trace import record

    first = record_trace(model_dir, RecordConfig(epochs=1, **SMALL), tmp_path / "a.jsonl.gz", tmp_path / "wa",
                         progress=False)  # fmt: skip
    (tmp_path / "wb").mkdir()
    shutil.copy(tmp_path / "wa" / record.WARMUP_CHECKPOINT, tmp_path / "wb" / record.WARMUP_CHECKPOINT)
    monkeypatch.setattr(record, "warmup", lambda *a, **k: pytest.fail("the warm-up ran again"))
    again = record_trace(model_dir, RecordConfig(epochs=1, **SMALL), tmp_path / "b.jsonl.gz", tmp_path / "wb",
                         progress=False)  # fmt: skip
    a, b = list(read_trace(tmp_path / "a.jsonl.gz")), list(read_trace(tmp_path / "b.jsonl.gz"))
    assert [r.response for r in a] == [r.response for r in b]
    assert [e.mean_reward for e in first] == [e.mean_reward for e in again]


def test_a_prompt_set_that_overflows_the_context_is_refused_before_training(model_dir, tmp_path, monkeypatch):
    from sglang_histospec.trace import record

    monkeypatch.setattr(record, "PROMPT_ROOM", 1)  # a context of max_new_tokens + 1: no prompt fits
    with pytest.raises(ValueError, match="max_new_tokens=1100"):
        record_trace(model_dir, RecordConfig(epochs=1, **{**SMALL, "max_new_tokens": 1100}),
                     tmp_path / "a.jsonl.gz", tmp_path / "wa", progress=False)  # fmt: skip
    assert not (tmp_path / "wa" / "warmup.pt").exists()
