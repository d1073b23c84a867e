"""The prompt-id rule (drafting/prompt_ids.py): explicit ids win, else a hash of the tokens; bad ids are refused."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from sglang_histospec.drafting.prompt_ids import TOKEN_ID_PREFIX, explicit_prompt_id, prompt_id_for, token_prompt_id

TOKENS = [1, 5, 7, 300]
DERIVED = TOKEN_ID_PREFIX + hashlib.sha1(np.asarray(TOKENS, dtype="<i8").tobytes()).hexdigest()


@pytest.mark.parametrize(
    ("custom_params", "expected"),
    [
        ({"prompt_id": "gsm-17"}, "gsm-17"),
        ({"prompt_id": 7}, "7"),
        ({"prompt_id": "tokens:abc"}, "tokens:abc"),  # an explicit id is used as is, whatever it looks like
        ({"prompt_id": None, "seed_offset": 2}, DERIVED),
        ({}, DERIVED),
        (None, DERIVED),
    ],
)
def test_prompt_id_for_table(custom_params, expected):
    assert prompt_id_for(custom_params, TOKENS) == expected


def test_token_id_depends_on_the_tokens_only():
    assert token_prompt_id(TOKENS) == token_prompt_id(tuple(TOKENS)) == token_prompt_id(np.array(TOKENS)) == DERIVED
    assert token_prompt_id([1, 5]) != token_prompt_id([5, 1]) != token_prompt_id([1, 5, 0])
    assert len(DERIVED) == len(TOKEN_ID_PREFIX) + 40


def test_token_id_is_the_same_in_another_process():
    code = f"from sglang_histospec.drafting.prompt_ids import token_prompt_id as t; print(t({TOKENS!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == DERIVED


@pytest.mark.parametrize(
    ("custom_params", "match"),
    [
        ({"prompt_id": True}, "prompt_id=True; use a string or an integer"),
        ({"prompt_id": 1.5}, "prompt_id=1.5; use a string or an integer"),
        ({"prompt_id": ["a"]}, "use a string or an integer"),
        ({"prompt_id": ""}, "prompt_id is empty"),
    ],
)
def test_bad_explicit_ids_are_refused(custom_params, match):
    with pytest.raises(ValueError, match=match):
        explicit_prompt_id(custom_params)


def test_an_empty_prompt_has_no_derived_id():
    with pytest.raises(ValueError, match="no tokens"):
        prompt_id_for(None, [])
