"""The one conversion of HTTP bodies into engine requests (no server, no torch): every bad input names its field."""

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sglang_histospec.drafting.prompt_ids import token_prompt_id
from sglang_histospec.server.app import create_app
from sglang_histospec.server.metrics import ServerCounters, prometheus_text
from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import (
    FieldError,
    GenerateBody,
    HistoryPushBody,
    RequestLimits,
    check_generate_body,
    check_generate_for_model,
    is_batch,
    to_generate_requests,
    to_history_entries,
)

LIMITS = ModelLimits(vocab_size=100, context_len=64)


def _inputs(body: dict, limits: ModelLimits = LIMITS):
    return to_generate_requests(
        GenerateBody.model_validate(body), limits, tokenize=lambda t: [1] + [5] * len(t), new_rid=lambda: "fresh"
    )


def test_single_and_batch_shapes():
    [one] = _inputs({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert (one.input_ids, one.sampling.max_new_tokens, one.sampling.temperature, one.rid) == (
        [1, 2, 3],
        8,
        0.0,
        "fresh",
    )
    assert one.prompt_id == token_prompt_id([1, 2, 3])  # no custom_params.prompt_id: the key derived from the tokens
    body = {
        "input_ids": [[1, 2], [3]],
        "rid": ["a", "b"],
        "return_logprob": [True, False],
        "sampling_params": [
            {"max_new_tokens": 4, "custom_params": {"prompt_id": "p0"}, "sampling_seed": 7, "top_k": 0},
            {"max_new_tokens": 5, "custom_params": {"prompt_id": 12}, "stop_token_ids": [2]},
        ],
    }
    a, b = _inputs(body)
    assert (a.rid, a.prompt_id, a.sampling.seed, a.sampling.top_k, a.return_logprob) == ("a", "p0", 7, -1, True)
    assert (b.rid, b.prompt_id, b.sampling.stop_token_ids, b.return_logprob) == ("b", "12", [2], False)
    assert is_batch(GenerateBody.model_validate(body))
    t1, t2 = _inputs({"text": ["ab", "abc"], "rid": "r", "sampling_params": {"max_new_tokens": 2}})
    assert (t1.input_ids, t2.input_ids, t1.rid, t2.rid) == ([1, 5, 5], [1, 5, 5, 5], "r_0", "r_1")


def test_sglang_hints_are_accepted_and_multimodal_inputs_refused():
    [req] = _inputs({"input_ids": [1, 2], "routing_key": "g", "extra_key": None, "image_data": None, "priority": 1})
    assert req.input_ids == [1, 2]
    with pytest.raises(ValidationError, match="image_data"):
        GenerateBody.model_validate({"input_ids": [1], "image_data": "http://x/y.png"})


def test_parallel_samples_expand_prompt_major():
    reqs = _inputs({"input_ids": [[1], [2]], "rid": ["a", "b"], "sampling_params": {"n": 2, "sampling_seed": 5}})
    assert [(r.input_ids, r.rid, r.sampling.seed) for r in reqs] == [
        ([1], "a_0", 5),
        ([1], "a_1", 6),
        ([2], "b_0", 5),
        ([2], "b_1", 6),
    ]


def test_default_max_new_tokens_is_clipped_to_the_context():
    [req] = _inputs({"input_ids": [1] * 60})
    assert req.sampling.max_new_tokens == 4


@pytest.mark.parametrize(
    "body, field",
    [
        ({"input_ids": [1, 100]}, "input_ids[1]"),
        ({"input_ids": [[1], [2, -1]]}, "input_ids[1][1]"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [[1], []]}, "input_ids[1]"),
        ({"text": ""}, "text"),
        ({}, "input_ids"),
        ({"text": "a", "input_ids": [1]}, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 64}}, "sampling_params.max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"input_ids": [1], "sampling_params": {"temperature": float("nan")}}, "sampling_params.temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ({"input_ids": [1], "sampling_params": {"top_k": -2}}, "sampling_params.top_k"),
        ({"input_ids": [1], "sampling_params": {"n": 0}}, "sampling_params.n"),
        ({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 3}]}, "sampling_params[1].n"),
        ({"input_ids": [1], "sampling_params": {"stop": ["x"]}}, "sampling_params.stop"),
        ({"input_ids": [1], "sampling_params": {"stop_token_ids": [100]}}, "sampling_params.stop_token_ids[0]"),
        ({"input_ids": [1], "sampling_params": {"custom_params": {"prompt_id": ""}}}, "custom_params.prompt_id"),
        ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params"),
        ({"input_ids": [[1], [2]], "rid": ["a", "a"]}, "rid"),
        ({"input_ids": [1], "stream": True}, "stream"),
        ({"input_ids": [1], "top_logprobs_num": 3}, "top_logprobs_num"),
        ({"input_ids": [1], "sampling_params": {"sampling_seed": -1}}, "sampling_params.sampling_seed"),
        ({"input_ids": [1], "sampling_params": {"seed": -(2**63)}}, "sampling_params.seed"),
        (
            {"input_ids": [[1], [2]], "sampling_params": [{}, {"sampling_seed": -5}]},
            "sampling_params[1].sampling_seed",
        ),
        ({"input_ids": [1], "sampling_params": {"custom_params": {"seed_offset": -1}}}, "custom_params.seed_offset"),
    ],
)
def test_bad_generate_bodies_name_the_field(body, field):
    with pytest.raises(FieldError) as e:
        _inputs(body)
    assert field in e.value.field


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": ["1"]},
        {"input_ids": [1.5]},
        {"input_ids": [True]},
        {"input_ids": [1], "bogus": 1},
        {"input_ids": [1], "sampling_params": {"bogus": 1}},
        {"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}},
        {"input_ids": [1], "return_logprob": "yes"},
    ],
)
def test_wrong_types_and_unknown_fields_are_refused(body):
    with pytest.raises(ValidationError):
        GenerateBody.model_validate(body)


def test_a_negative_seed_is_refused_without_the_model():
    body = GenerateBody.model_validate({"input_ids": [1], "sampling_params": {"sampling_seed": -1, "n": 2}})
    with pytest.raises(FieldError, match=r"sampling_params.sampling_seed: must be an int >= 0") as e:
        check_generate_body(body, RequestLimits())  # what the router runs before forwarding
    assert e.value.field == "sampling_params.sampling_seed"
    [zero] = _inputs({"input_ids": [1], "sampling_params": {"sampling_seed": 0}})
    assert zero.sampling.seed == 0


def test_model_checks_run_on_input_ids_or_tokenized_prompts():
    body = GenerateBody.model_validate({"input_ids": [[1], [2]], "sampling_params": {"stop_token_ids": [7]}})
    check_generate_for_model(body, LIMITS)
    with pytest.raises(FieldError) as e:
        check_generate_for_model(body, ModelLimits(vocab_size=5, context_len=64))
    assert e.value.field == "sampling_params.stop_token_ids[0]"
    text = GenerateBody.model_validate({"text": ["a", "b"]})
    with pytest.raises(FieldError) as e:
        check_generate_for_model(text, LIMITS, prompts=[[1], [1] * 64])
    assert e.value.field == "text[1]"


def test_the_route_refuses_a_negative_seed_before_submitting_anything():
    class Recording:  # the parts of a Backend that POST /generate touches before it submits
        def __init__(self) -> None:
            self.submitted: list = []

        def limits(self) -> ModelLimits:
            return LIMITS

        def tokenize(self, text: str) -> list[int]:
            return [1]

        async def generate(self, requests):
            self.submitted.append(requests)
            raise AssertionError("a refused request reached the backend")

    backend = Recording()
    client = TestClient(create_app(backend))  # type: ignore[arg-type]
    r = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"sampling_seed": -7}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "sampling_params.sampling_seed"
    assert "must be an int >= 0" in r.json()["error"]["message"]
    assert backend.submitted == []


def test_text_needs_a_tokenizer():
    with pytest.raises(FieldError, match="no tokenizer"):
        _inputs({"text": "ab"}, ModelLimits(vocab_size=100, context_len=64, has_tokenizer=False))


@pytest.mark.parametrize(
    "entries, field",
    [
        ([{"prompt_id": "p", "responses": [[1, 2], [3, 100]]}], "entries[0].responses[1][1]"),
        ([{"prompt_id": "p", "responses": [[1]], "rewards": [1.0, 2.0]}], "entries[0].rewards"),
        ([{"prompt_id": "", "responses": [[1]]}], "entries[0].prompt_id"),
        (
            [{"prompt_id": "p", "responses": [[1]]}, {"prompt_id": "q", "responses": [[-3]]}],
            "entries[1].responses[0][0]",
        ),
        ([{"prompt_id": "p", "responses": [[1]], "prompt_tokens": [500]}], "entries[0].prompt_tokens[0]"),
    ],
)
def test_bad_history_entries_name_the_field(entries, field):
    with pytest.raises(FieldError) as e:
        to_history_entries(HistoryPushBody.model_validate({"step": 1, "entries": entries}), LIMITS)
    assert e.value.field == field


def test_history_entries_convert():
    body = {"step": 2, "entries": [{"prompt_id": 7, "responses": [[1, 2], []], "rewards": [1, 0.5]}]}
    [entry] = to_history_entries(HistoryPushBody.model_validate(body), LIMITS)
    assert (entry.prompt_id, entry.responses, entry.rewards) == ("7", [[1, 2], []], [1.0, 0.5])
    with pytest.raises(ValidationError):
        HistoryPushBody.model_validate({"step": -1, "entries": []})


def test_prometheus_text_has_every_counter_and_history_gauge():
    c = ServerCounters()
    c.observe(prompt_tokens=3, completion_tokens=8, verify_steps=4, drafted=10, accepted=4, finish_type="length")
    assert c.tau() == 2.0 and c.accept_rate() == 0.4
    text = prometheus_text(c, {"history_tokens": 120, "memory_bytes": 4096, "prompts": 2}, {"x_running": 1})
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert values["histospec_requests_total"] == "1"
    assert values["histospec_generated_tokens_total"] == "8"
    assert values["histospec_verify_steps_total"] == "4"
    assert values["histospec_draft_tokens_total"] == "10"
    assert values["histospec_accepted_tokens_total"] == "4"
    assert values["histospec_tau"] == "2.0"
    assert values["histospec_history_tokens"] == "120"
    assert values["histospec_history_bytes"] == "4096"
    assert values["x_running"] == "1"
