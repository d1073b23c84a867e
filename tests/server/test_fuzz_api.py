"""Schema-driven fuzzing of the server's and the router's HTTP APIs (hypothesis over the request models; bounded
in count, loopback only): no request gets a 5xx, and a rejected request changes no history, here or behind the
router. ``-m slow`` runs many more examples."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_histospec.router.app import create_app as create_router_app
from sglang_histospec.router.config import RouterConfig
from sglang_histospec.router.router import Router
from sglang_histospec.server.schemas import (
    AbortRequestBody,
    CustomParams,
    EndStepBody,
    GenerateBody,
    HistoryEntryBody,
    HistoryPushBody,
    SamplingParamsBody,
    StepBody,
    StepPrompt,
    UpdateWeightsFromDiskBody,
)
from tests.helpers.server_harness import ServerThread, shared_tiny_model_dir

QUICK, SLOW = 25, 300

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["\ud800", "", "x" * 600, "/", "/etc/passwd", "a\udfffb"]),
)
_ids = st.lists(st.integers(-2, 70), max_size=6)
_values = st.recursive(
    _scalars | _ids,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
# fields whose random values are drawn closer to valid ones, so fuzzing gets past the type checks
_TARGETED = {
    "input_ids": _ids | st.lists(_ids, max_size=3),
    "text": st.text(max_size=8) | st.lists(st.text(max_size=6), max_size=3) | st.just("\ud800"),
    "max_new_tokens": st.integers(-2, 6) | st.sampled_from([10**6, 2**63, True]),
    "n": st.integers(-1, 3) | st.sampled_from([5000, True]),
    "group_size": st.integers(-1, 3) | st.sampled_from([100_000, True]),
    "temperature": st.floats(-1, 3) | st.sampled_from([float("nan"), float("inf")]),
    "top_p": st.floats(-0.5, 1.5),
    "top_k": st.integers(-3, 70),
    "step": st.integers(-2, 5) | st.sampled_from([None, True, "1", 2**64]),
    "responses": st.lists(_ids, max_size=3),
    "rewards": st.lists(st.floats(allow_nan=True), max_size=3),
    "prompt_id": st.text(max_size=6) | st.integers(-5, 5) | st.sampled_from(["\ud800", "p" * 600, 2**64]),
    "rid": st.text(max_size=6) | st.lists(st.text(max_size=4), max_size=3),
    "sampling_seed": st.integers(-(2**65), 2**65),
    "model_path": st.sampled_from(["/", "/etc/passwd", "/nonexistent", "", "\ud800", "/proc/self"]),
}
_NESTED = {
    (GenerateBody, "sampling_params"): (SamplingParamsBody, "maybe-list"),
    (StepBody, "sampling_params"): (SamplingParamsBody, "one"),
    (SamplingParamsBody, "custom_params"): (CustomParams, "one"),
    (HistoryPushBody, "entries"): (HistoryEntryBody, "list"),
    (StepBody, "prompts"): (StepPrompt, "list"),
}


@st.composite
def bodies(draw, model) -> dict:
    """A JSON object over ``model``'s field names (plus an unknown one), values random or near-valid."""
    names = [*model.model_fields, "bogus"]
    out = {}
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=6)):
        nested = _NESTED.get((model, name))
        if nested is not None and draw(st.booleans()):
            sub, shape = nested
            one = draw(bodies(sub))
            many = draw(st.lists(bodies(sub), min_size=1, max_size=3))
            out[name] = many if shape == "list" or (shape == "maybe-list" and draw(st.booleans())) else one
        else:
            out[name] = draw(_TARGETED.get(name, _values))
    return out


SERVER_ROUTES = [
    ("/generate", GenerateBody),
    ("/histospec/history", HistoryPushBody),
    ("/histospec/end_step", EndStepBody),
    ("/update_weights_from_disk", UpdateWeightsFromDiskBody),
    ("/abort_request", AbortRequestBody),
]
ROUTER_ROUTES = [*SERVER_ROUTES, ("/histopipe/step", StepBody)]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    model_dir = shared_tiny_model_dir(tmp_path_factory)
    with ServerThread(model_dir, speculative_algorithm="NONE", max_context_len=48) as srv:
        yield srv


@pytest.fixture(scope="module")
def router(backend):
    r = Router(RouterConfig(backends=[backend.url], health_interval_s=0.5))
    r.start()
    yield r
    r.close()


def _check(client, path: str, body, history_of) -> None:
    before = history_of()
    content = json.dumps(body, allow_nan=True).encode()  # lone surrogates travel as JSON escapes
    r = client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (path, body, r.status_code, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["message"], (path, body, r.text)
        assert history_of() == before, (path, body, r.text)


def _server_history(srv: ServerThread):
    return lambda: srv.client.stats()["history"]


def _router_history(router: Router, srv: ServerThread):
    return lambda: (router.stats()["prompts_with_history"], srv.client.stats()["history"])


def _fuzz(n: int):
    return settings(
        max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=n == QUICK
    )


@pytest.mark.parametrize("path, model", SERVER_ROUTES, ids=[p for p, _ in SERVER_ROUTES])
def test_server_fuzz_no_5xx_and_rejections_change_nothing(backend, path, model) -> None:
    client = backend.client._http

    @_fuzz(QUICK)
    @given(body=bodies(model) | _values)
    def run(body) -> None:
        _check(client, path, body, _server_history(backend))

    run()


@pytest.mark.parametrize("path, model", ROUTER_ROUTES, ids=[p for p, _ in ROUTER_ROUTES])
def test_router_fuzz_no_5xx_and_rejections_change_nothing(backend, router, path, model) -> None:
    client = TestClient(create_router_app(router))

    @_fuzz(QUICK)
    @given(body=bodies(model) | _values)
    def run(body) -> None:
        _check(client, path, body, _router_history(router, backend))

    run()


HUGE_INT = b"9" * 5000  # beyond Python's int parsing limit: json.loads raises a plain ValueError


@pytest.mark.parametrize(
    "path, content",
    [
        ("/histospec/history", b'{"step": 1, "entries": [{"prompt_id": ' + HUGE_INT + b', "responses": [[4]]}]}'),
        ("/generate", b'{"input_ids": [1, ' + HUGE_INT + b"]}"),
        ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}'),
        ("/generate", b'{"text": "\xff\xfe"}'),
    ],
)
def test_unparseable_numbers_and_bytes_are_400(backend, router, path, content) -> None:
    for client in (backend.client._http, TestClient(create_router_app(router))):
        r = client.post(path, content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["field"], r.text


@pytest.mark.slow  # many examples per route, both APIs (several minutes)
@pytest.mark.parametrize("path, model", ROUTER_ROUTES, ids=[p for p, _ in ROUTER_ROUTES])
def test_fuzz_many_examples(backend, router, path, model) -> None:
    server_client, router_client = backend.client._http, TestClient(create_router_app(router))

    @_fuzz(SLOW)
    @given(body=bodies(model) | _values)
    def run(body) -> None:
        if path != "/histopipe/step":
            _check(server_client, path, body, _server_history(backend))
        _check(router_client, path, body, _router_history(router, backend))

    run()


STRICT_BODIES = [
    # (path, content type, body, status, field, words in the message)
    ("/generate", "application/x-www-form-urlencoded", b"text=hi", 415, "Content-Type", "x-www-form-urlencoded"),
    ("/histospec/history", "text/plain", b'{"step": 1, "entries": []}', 415, "Content-Type", "text/plain"),
    ("/generate", "application/json", b'{"text": "ab", "text": "cd"}', 400, "text", 'duplicate JSON key "text"'),
    (
        "/histospec/history",
        "application/json; charset=utf-8",
        b'{"step": 1, "entries": [{"prompt_id": "p", "prompt_id": "q", "responses": [[4]]}]}',
        400,
        "prompt_id",
        'duplicate JSON key "prompt_id"',
    ),
]


@pytest.mark.parametrize(("path", "ctype", "content", "status", "field", "words"), STRICT_BODIES)
def test_body_not_json_is_415_and_repeated_key_is_400(backend, router, path, ctype, content, status, field, words):
    """Issue 44: both APIs name the content type (415) or the repeated key (400) and change nothing."""
    for client, history_of in (
        (backend.client._http, _server_history(backend)),
        (TestClient(create_router_app(router)), _router_history(router, backend)),
    ):
        before = history_of()
        r = client.post(path, content=content, headers={"Content-Type": ctype})
        assert r.status_code == status, (path, r.text)
        err = r.json()["error"]
        assert err["field"] == field and words in err["message"], r.text
        assert history_of() == before
