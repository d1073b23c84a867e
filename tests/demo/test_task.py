"""The demo's building blocks: arithmetic task and reward, tokenizer, tiny-model pretraining and its cache."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from sglang_histospec.demo import model as demo_model
from sglang_histospec.demo.task import (
    ALPHABET,
    ArithTask,
    TaskConfig,
    all_solutions,
    evaluate,
    parse,
    render,
    solution_text,
)
from sglang_histospec.demo.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from tests.helpers.demo_tools import TINY


@pytest.mark.parametrize(
    "prompt, completion, expected",
    [
        ("3+4*2=", "4*2=8,3+8=11#11", 1.0),
        ("3+4*2=", "3+8=11#11", 1.0),
        ("3+4*2=", "#11", 1.0),  # only the final answer is checked
        ("3+4*2=", "4*2=8,3+8=11#11</s>", 1.0),  # special tokens ignored
        ("<s>3+4*2=", " 4*2=8,3+8=11#11 ", 1.0),
        ("3+4*2=", "3+4=7,7*2=14#14", 0.0),  # wrong precedence
        ("3+4*2=", "4*2=8,3+8=11", 0.0),  # no answer
        ("3+4*2=", "#11#12", 0.0),  # the last answer counts
        ("3+4*2=", "#11,", 0.0),  # the answer must end the completion
        ("3+4*2=", "#1 1", 0.0),
        ("3+4*2=", "", 0.0),
        ("(9-2)*(1+3)=", "9-2=7,1+3=4,7*4=28#28", 1.0),
        ("9-2-3=", "#4", 1.0),  # left-associative
        ("9-2-3=", "#10", 0.0),
    ],
)
def test_reward_table(prompt, completion, expected):
    assert ArithTask(TaskConfig(num_prompts=1)).reward(prompt, completion) == expected


def test_format_reward_only_for_well_formed_wrong_answers():
    task = ArithTask(TaskConfig(num_prompts=1, format_reward=0.1))
    assert task.reward("1+2=", "#3") == 1.0
    assert task.reward("1+2=", "#4") == 0.1
    assert task.reward("1+2=", "1+2=3") == 0.0


def test_reward_rejects_a_prompt_that_is_not_an_expression():
    with pytest.raises(ValueError, match="followed by '='"):
        ArithTask(TaskConfig(num_prompts=1)).reward("3+4", "#7")


@pytest.mark.parametrize(
    "text, value",
    [("3+4*2", 11), ("(3+4)*2", 14), ("9-2-3", 4), ("9-(2-3)+1", 11), ("2*3+4*5", 26), ("((7))", 7), ("12*10", 120)],
)
def test_parse_evaluate_render_table(text, value):
    tree = parse(text)
    assert evaluate(tree) == value
    assert parse(render(tree)) == tree  # render keeps the tree with the fewest parentheses


@pytest.mark.parametrize("bad", ["", "3+", "(3+4", "3+4)", "3 + 4", "a", "3/4"])
def test_parse_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse(bad)


@pytest.mark.parametrize(
    "text, order, style, swaps, expected",
    [
        ("3+4*2", [0, 0], "steps", None, "4*2=8,3+8=11#11"),
        ("3+4*2", [0, 0], "steps", [True, True], "2*4=8,8+3=11#11"),
        ("3+4*2", [0, 0], "chain", None, "3+8=11#11"),
        ("(1+2)*(3+4)", [1, 0, 0], "steps", None, "3+4=7,1+2=3,3*7=21#21"),
        ("(1+2)*(3+4)", [1, 0, 0], "chain", None, "(1+2)*7=3*7=21#21"),
        ("9-2", [0], "steps", [True], "9-2=7#7"),  # '-' is never swapped
    ],
)
def test_solution_text_table(text, order, style, swaps, expected):
    assert solution_text(parse(text), order, style, swaps) == expected


def test_every_sampled_solution_is_correct_and_prompts_have_several():
    task = ArithTask(TaskConfig(seed=5, num_prompts=32))
    rng = random.Random(0)
    for p in task.prompts:
        sols = all_solutions(parse(p.text[:-1]))
        assert len(sols) == p.num_solutions >= 2
        assert all(task.reward(p.text, s) == 1.0 for s in sols)
        drawn = {task.sample_solution(p.text, rng) for _ in range(40)}
        assert drawn <= set(sols)
        assert len(drawn) >= 2  # real entropy: styles, orders, operand swaps
    assert all(set(s) <= set(ALPHABET) for p in task.prompts for s in [p.text, *all_solutions(parse(p.text[:-1]))])


def test_prompt_set_is_deterministic_with_stable_ids():
    a, b = ArithTask(TaskConfig(seed=7)), ArithTask(TaskConfig(seed=7))
    assert a.prompts == b.prompts
    assert [p.prompt_id for p in a.prompts] == [f"arith-{i:04d}" for i in range(64)]
    assert len({p.text for p in a.prompts}) == 64
    assert a.prompts != ArithTask(TaskConfig(seed=8)).prompts
    assert a.prompt("arith-0003") == a.prompts[3]
    with pytest.raises(ValueError, match="unknown prompt_id"):
        a.prompt("gsm-0001")
    assert a.rows()[0] == {"prompt": a.prompts[0].text, "prompt_id": "arith-0000", "answer": a.prompts[0].answer}
    cfg = a.config
    for p in a.prompts:
        tree = parse(p.text[:-1])
        assert cfg.min_ops <= p.text.count("+") + p.text.count("-") + p.text.count("*") <= cfg.max_ops
        assert 0 <= evaluate(tree) == p.answer <= cfg.max_value


def test_training_texts_are_deterministic_and_exclude_the_prompt_set():
    task = ArithTask(TaskConfig(seed=2, num_prompts=16))
    first = task.training_texts(300, seed=1)
    assert first == task.training_texts(300, seed=1)
    assert first != task.training_texts(300, seed=2)
    assert not {p for p, _ in first} & {p.text for p in task.prompts}
    assert all(task.reward(p, s) == 1.0 for p, s in first)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_ops": 3, "max_ops": 2}, "min_ops"),
        ({"styles": ("poetry",)}, "styles"),
        ({"styles": ()}, "styles"),
        ({"num_prompts": 0}, "num_prompts"),
        ({"format_reward": 1.0}, "format_reward"),
    ],
)
def test_task_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TaskConfig(**kwargs)


def test_tokenizer_round_trip_and_reload(tmp_path):
    from transformers import AutoTokenizer

    tok = build_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert len(tok) == 4 + len(ALPHABET)
    task = ArithTask(TaskConfig(seed=4, num_prompts=16))
    texts = [p.text + s for p in task.prompts for s in all_solutions(parse(p.text[:-1]))]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in texts:
        ids = tok(text).input_ids
        assert ids[0] == BOS_ID and len(ids) == len(text) + 1  # one token per character
        assert tok.decode(ids + [EOS_ID], skip_special_tokens=True) == text
        assert again(text).input_ids == ids
    assert again.padding_side == "left"
    assert tok("3x").input_ids[-1] == tok.unk_token_id


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
