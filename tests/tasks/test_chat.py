"""The chat task families: deterministic prompt sets, rewards, and warm-up data outside the prompt set."""

from __future__ import annotations

import random

import pytest

from sglang_histospec.tasks.chat import FAMILIES, HELD_OUT, make_family


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_reference_solutions_score_one_and_prompt_sets_are_stable(name):
    fam, again = make_family(name, num_prompts=8, seed=3), make_family(name, num_prompts=8, seed=3)
    assert [p.text for p in fam.prompts] == [p.text for p in again.prompts]
    assert len({p.prompt_id for p in fam.prompts}) == 8
    rng = random.Random(0)
    for p in fam.prompts:
        assert fam.reward(p, fam.solution(p, rng)) == 1.0


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_warmup_examples_are_outside_the_prompt_set(name):
    fam = make_family(name, num_prompts=16)
    texts = {p.text for p in fam.prompts}
    examples = fam.warmup_examples(32)
    assert len(examples) == 32 and not texts & {q for q, _ in examples}


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Step 1: ...\nAnswer: {answer}", 1.0),
        ("Answer: {answer}.", 1.0),  # a trailing period is normalised away
        ("answer on the last line?\nAnswer: 123456789", 0.1),  # wrong answer, right format
        ("Answer: {answer}\nand then some more text", 0.0),  # the answer line must be last
        ("", 0.0),
    ],
)
def test_reward_table(completion, expected):
    fam = make_family("arith", num_prompts=1)
    p = fam.prompts[0]
    assert fam.reward(p, completion.format(answer=p.answer)) == expected


def test_unknown_family_and_bad_count_are_clear_errors():
    with pytest.raises(ValueError, match="unknown task family 'chess'"):
        make_family("chess")
    with pytest.raises(ValueError, match="num_prompts=0"):
        make_family("sort", num_prompts=0)
    assert set(FAMILIES).issuperset(HELD_OUT)
