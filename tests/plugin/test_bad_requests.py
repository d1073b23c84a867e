"""The SGLang backend (``python -m sglang_histospec.server.sglang_backend``, real SGLang 0.5.23 on CPU; marker
``sglang``) refuses every bad request of tests/helpers/bad_requests.py as the torch backend does, before SGLang's
tokenizer manager or scheduler sees it, reads a JSON body without Content-Type as JSON, and keeps serving; a plain
SGLang server with the plugin installed refuses an id outside the vocabulary instead of crashing (issue 55)."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.bad_requests import (
    BAD_REQUESTS,
    SP,
    VALID_GENERATE,
    VOCAB,
    check_json_without_content_type,
    check_refused,
    check_still_serves,
)
from tests.sglang_harness import SGLangServer

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900), pytest.mark.usefixtures("sglang_harness")]


@pytest.fixture(scope="module")
def servers(sglang_model_dir):
    """The SGLang backend, and plain SGLang with HISTOSPEC (the plugin's own guard only), started side by side."""
    backend = SGLangServer(
        ["--model-path", sglang_model_dir, "--speculative-num-draft-tokens", "6"],
        module="sglang_histospec.server.sglang_backend",
    )
    plain = SGLangServer(
        [
            "--model-path",
            sglang_model_dir,
            "--speculative-algorithm",
            "HISTOSPEC",
            "--speculative-num-draft-tokens",
            "6",
        ]
    )
    try:
        backend.launch()
        plain.launch()
        backend.wait_ready()
        plain.wait_ready()
        yield backend, plain
    finally:
        backend.stop()
        plain.stop()


@pytest.fixture(scope="module")
def backend(servers):
    return servers[0]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c.name for c in BAD_REQUESTS])
def test_bad_request_is_refused_naming_the_field(backend, case) -> None:
    check_refused(backend.url, case)
    assert backend.proc.poll() is None, backend.log_tail()


def test_json_body_without_content_type_is_read_as_json(backend) -> None:
    check_json_without_content_type(backend.url)


def test_still_serves_after_bad_requests(backend) -> None:
    for case in BAD_REQUESTS:
        check_refused(backend.url, case)
    check_still_serves(backend.url)
    r = httpx.post(
        backend.url + "/v1/completions", json={"model": "m", "prompt": [1, 5], "max_tokens": 2}, timeout=120
    )
    assert r.status_code == 200, r.text
    streamed = httpx.post(backend.url + "/generate", json={**VALID_GENERATE, "stream": True}, timeout=120)
    assert streamed.status_code == 200 and streamed.text.startswith("data: "), streamed.text  # SGLang's own feature


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"input_ids": [1, 5, VOCAB], "sampling_params": SP}),
        ("/generate", {"input_ids": [[1, 5], [1, -1]], "sampling_params": SP}),
        ("/v1/completions", {"model": "m", "prompt": [1, VOCAB], "max_tokens": 2}),
    ],
)
def test_plain_sglang_with_the_plugin_refuses_oov_ids(servers, path, body) -> None:
    """SGLang 0.5.23 alone crashes its scheduler on these (docs/reliability.md); the plugin's hook answers 400."""
    _, plain = servers
    r = httpx.post(plain.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "outside the vocabulary" in r.text, r.text
    assert plain.proc.poll() is None, plain.log_tail()
    check_still_serves(plain.url)
