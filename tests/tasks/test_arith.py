"""The toy arithmetic task: parsing, solutions, the prompt set and the reward."""

from __future__ import annotations

import random

import pytest

from sglang_histospec.tasks.arith import (
    ALPHABET,
    ArithTask,
    TaskConfig,
    all_solutions,
    evaluate,
    parse,
    render,
    solution_text,
)


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
