"""Bad generation and history requests that every backend must refuse with a fast 400 naming the field (issue
55), shared by tests/server/test_bad_requests.py (torch backend) and tests/plugin/test_bad_requests.py (SGLang
backend). The served model is the tests' tiny Llama with vocabulary 64."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

VOCAB = 64
SP = {"max_new_tokens": 2, "temperature": 0.0}
VALID_GENERATE = {"input_ids": [1, 5, 6], "sampling_params": SP}


@dataclass(frozen=True)
class BadRequest:
    """``body`` POSTed to ``path`` gets 400 with ``field`` and a message containing ``says``."""

    name: str
    path: str
    body: Any
    field: str
    says: str
    sglang_only: bool = False
    """An OpenAI route: the torch backend serves none."""


def _sp(**kw: Any) -> dict:
    return {**SP, **kw}


BAD_REQUESTS = [
    BadRequest("oov_id", "/generate", {"input_ids": [1, 5, VOCAB], "sampling_params": SP}, "input_ids[2]",
               f"token id {VOCAB} is outside the vocabulary [0, {VOCAB})"),
    BadRequest("negative_id", "/generate", {"input_ids": [1, -1], "sampling_params": SP}, "input_ids[1]",
               "token id -1 is outside the vocabulary"),
    BadRequest("oov_id_in_batch", "/generate", {"input_ids": [[1, 5], [1, 99]], "sampling_params": SP},
               "input_ids[1][1]", "token id 99 is outside the vocabulary"),
    BadRequest("short_sampling_params", "/generate", {"input_ids": [[1, 5], [1, 6]], "sampling_params": [SP]},
               "sampling_params", "has 1 items but the batch has 2 prompts"),
    BadRequest("prompt_id_object", "/generate",
               {"input_ids": [1, 5], "sampling_params": _sp(custom_params={"prompt_id": {"a": 1}})},
               "sampling_params.custom_params.prompt_id", "must be a string or an integer"),
    BadRequest("negative_seed", "/generate", {"input_ids": [1, 5], "sampling_params": _sp(sampling_seed=-1)},
               "sampling_params.sampling_seed", "must be an int >= 0"),
    BadRequest("huge_seed", "/generate", {"input_ids": [1, 5], "sampling_params": _sp(sampling_seed=2**70)},
               "sampling_params.sampling_seed", "less than or equal to 9223372036854775807"),
    BadRequest("empty_input_ids", "/generate", {"input_ids": [], "sampling_params": SP}, "input_ids", "empty"),
    BadRequest("string_input_ids", "/generate", {"input_ids": "1 5", "sampling_params": SP}, "input_ids",
               "must be a list, got a string"),
    BadRequest("negative_max_new_tokens", "/generate", {"input_ids": [1, 5], "sampling_params": _sp(max_new_tokens=-1)},
               "sampling_params.max_new_tokens", "must be >= 1"),
    BadRequest("oov_stop_token", "/generate", {"input_ids": [1, 5], "sampling_params": _sp(stop_token_ids=[70])},
               "sampling_params.stop_token_ids[0]", "token id 70 is outside the vocabulary"),
    BadRequest("penalty_out_of_range", "/generate",
               {"input_ids": [1, 5], "sampling_params": _sp(frequency_penalty=5.0)},
               "sampling_params.frequency_penalty", "frequency_penalty"),
    BadRequest("string_reward", "/histospec/history",
               {"step": 0, "entries": [{"prompt_id": "p", "responses": [[5]], "rewards": ["1"]}]},
               "entries[0].rewards[0]", "must be a number, got a string"),
    BadRequest("completions_oov_id", "/v1/completions", {"model": "m", "prompt": [1, VOCAB], "max_tokens": 2},
               "prompt[1]", "outside the vocabulary", sglang_only=True),
    BadRequest("completions_oov_id_in_batch", "/v1/completions",
               {"model": "m", "prompt": [[1, 5], [-2]], "max_tokens": 2}, "prompt[1][0]", "outside the vocabulary",
               sglang_only=True),
    BadRequest("completions_negative_seed", "/v1/completions",
               {"model": "m", "prompt": [1, 5], "max_tokens": 2, "seed": -1}, "seed", "must be an int >= 0",
               sglang_only=True),
]  # fmt: skip


def check_refused(url: str, case: BadRequest) -> None:
    """POST ``case`` and check the 400 in the shared error format."""
    r = httpx.post(url + case.path, json=case.body, timeout=60)
    assert r.status_code == 400, (case.name, r.status_code, r.text)
    error = r.json()["error"]
    assert error.get("field") == case.field, (case.name, r.text)
    assert case.says in error["message"] and error["message"].startswith(case.field), (case.name, r.text)


def check_json_without_content_type(url: str) -> None:
    """A JSON body sent without a Content-Type header is read as JSON."""
    raw = httpx.Request("POST", url + "/generate", content=json.dumps(VALID_GENERATE).encode())
    assert "content-type" not in raw.headers
    with httpx.Client(timeout=120) as client:
        r = client.send(raw)
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) == SP["max_new_tokens"]


def check_still_serves(url: str) -> None:
    """A valid request is answered after the bad ones."""
    r = httpx.post(url + "/generate", json=VALID_GENERATE, timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) == SP["max_new_tokens"]
