"""Prompt ids for the history (pure: no server, no TRL)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trl_integration.prompt_ids import HASH_PREFIX, resolve_prompt_ids, stable_prompt_id


@pytest.mark.parametrize(
    ("rows", "column", "expected"),
    [
        ([{"prompt": "a", "prompt_id": "p7"}], "prompt_id", ["p7"]),
        ([{"prompt": "a", "prompt_id": 7}], "prompt_id", ["7"]),
        ([{"prompt": "a", "qid": "x"}], "qid", ["x"]),
        ([{"prompt": "a"}], "prompt_id", [None]),  # derived from the prompt tokens at generation
        ([{"prompt": "a", "prompt_id": None}], "prompt_id", [None]),
    ],
)
def test_resolve_prompt_ids_table(rows, column, expected):
    assert resolve_prompt_ids(rows, column, hash_missing=True) == expected


def test_hash_is_stable_across_processes_and_distinguishes_prompts():
    chat = [{"role": "user", "content": "2+2="}]
    code = f"from trl_integration.prompt_ids import stable_prompt_id as h; print(h('2+2='), h({chat!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [stable_prompt_id("2+2="), stable_prompt_id(chat)]
    assert stable_prompt_id("2+2=") != stable_prompt_id("2+3=") != stable_prompt_id(chat)
    assert stable_prompt_id("2+2=").startswith(HASH_PREFIX) and len(stable_prompt_id("x")) == len(HASH_PREFIX) + 16


@pytest.mark.parametrize(
    ("rows", "hash_missing", "match"),
    [
        ([{"prompt": "a"}], False, "no 'prompt_id' column.*hash_prompt_ids=True"),
        ([{"prompt": "a", "prompt_id": ""}], True, "'prompt_id' is empty"),
        ([{"text": "a"}], True, "neither 'prompt_id' nor 'prompt'"),
    ],
)
def test_resolve_prompt_ids_errors(rows, hash_missing, match):
    with pytest.raises(ValueError, match=match):
        resolve_prompt_ids(rows, "prompt_id", hash_missing=hash_missing)


def test_package_import_does_not_import_trl():
    code = "import sys, trl_integration; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
