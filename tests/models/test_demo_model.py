"""The toy model: its configuration, the supervised examples, pretraining and its cache."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sglang_histospec.models import demo_model
from sglang_histospec.models.demo_tokenizer import EOS_ID, PAD_ID, build_tokenizer
from sglang_histospec.tasks.arith import TaskConfig
from tests.helpers.demo_tools import TINY


def test_encode_examples_masks_the_prompt():
    tok = build_tokenizer()
    ids, labels = demo_model.encode_examples(tok, [("1+2=", "3#3"), ("12*3=", "36#36")], max_len=32)
    assert ids.shape == labels.shape == (2, 12)  # <s> 12*3= 36#36 </s>
    assert ids[0].tolist() == tok("1+2=3#3").input_ids + [EOS_ID] + [PAD_ID] * 3
    completion = tok("3#3", add_special_tokens=False).input_ids + [EOS_ID]
    assert labels[0].tolist() == [-100] * 5 + completion + [-100] * 3
    with pytest.raises(ValueError, match="max_positions"):
        demo_model.encode_examples(tok, [("1+2=", "3#3")], max_len=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"arch": "gpt2"}, "arch"),
        ({"hidden_size": 30, "num_heads": 4}, "hidden_size"),
        ({"max_steps": 0}, "max_steps"),
        ({"target_reward": 1.5}, "target_reward"),
    ],
)
def test_model_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        demo_model.DemoModelConfig(**kwargs)


def test_cache_key_follows_the_config():
    assert TINY.cache_key() == dataclasses.replace(TINY).cache_key()
    assert TINY.cache_key() != dataclasses.replace(TINY, seed=1).cache_key()
    assert TINY.cache_key() != dataclasses.replace(TINY, task=TaskConfig(seed=4, num_prompts=8)).cache_key()
    assert demo_model.QUICK_CONFIG.cache_key() != demo_model.DemoModelConfig().cache_key()


def test_short_pretraining_lowers_loss_and_cache_hit_skips_training(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = demo_model.build_or_load_demo_model(tmp_path, config=TINY, progress=False)
    assert path == tmp_path / "demo-models" / TINY.cache_key()
    meta = demo_model.load_meta(path)
    losses = meta["result"]["losses"]
    assert len(losses) == TINY.max_steps
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5
    assert meta["config"] == json.loads(json.dumps(dataclasses.asdict(TINY)))
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary directory left behind

    # The saved directory loads with plain transformers and generates.
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    completions = demo_model.sample_completions(model, tok, ["1+2=", "3*4-5="], max_new_tokens=8, seed=0)
    assert len(completions) == 2 and all(isinstance(c, str) for c in completions)

    def must_not_train(*args, **kwargs):
        raise AssertionError("a cached configuration was trained again")

    monkeypatch.setattr(demo_model, "pretrain", must_not_train)
    assert demo_model.build_or_load_demo_model(tmp_path, config=TINY, progress=False) == path
    with pytest.raises(AssertionError, match="trained again"):
        demo_model.build_or_load_demo_model(tmp_path, config=dataclasses.replace(TINY, seed=9), progress=False)


def test_load_meta_rejects_a_foreign_directory(tmp_path):
    with pytest.raises(ValueError, match="build_or_load_demo_model"):
        demo_model.load_meta(tmp_path)
