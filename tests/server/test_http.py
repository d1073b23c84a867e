"""The real rollout server (torch backend, uvicorn on loopback) on tiny models: every endpoint, bad inputs,
greedy equality with and without HistoSpec, history pushed while requests run."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from sglang_histospec.drafting.prompt_ids import token_prompt_id
from sglang_histospec.server.client import ServerError
from tests.helpers.server_harness import (
    LONG_RUN_TOKENS,
    ServerThread,
    long_context_model_dir,
    shared_tiny_model_dir,
)
from tests.helpers.tiny import make_char_tokenizer

PROMPTS = ["what is 1+1?", "hello world", "abc abc abc", "the cat sat on", "x = 3 * 4", "why?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return shared_tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def tok():
    return make_char_tokenizer(64)


@pytest.fixture(scope="module")
def spec(model_dir):
    # draft_selection="always": these tests check that history turns into accepted drafts; whether drafting pays is
    # the engine's cost-aware cut, tested deterministically in tests/engine/test_greedy.py
    with ServerThread(
        model_dir, speculative_algorithm="HISTOSPEC", max_request_bytes=2**20, draft_selection="always"
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain(model_dir):
    with ServerThread(model_dir, speculative_algorithm="NONE") as srv:
        yield srv


def _ids(tok, text: str) -> list[int]:
    return list(tok(text).input_ids)


def _post(srv: ServerThread, path: str, body=None, content: bytes | None = None, headers=None) -> httpx.Response:
    if content is not None:
        return httpx.post(srv.url + path, content=content, headers=headers or {}, timeout=60)
    return httpx.post(srv.url + path, json=body, headers=headers or {}, timeout=60)


def test_health_and_model_info(spec):
    assert httpx.get(spec.url + "/health").status_code == 200
    for path in ("/get_model_info", "/model_info"):
        info = httpx.get(spec.url + path).json()
        assert info["is_generation"] is True
        assert info["vocab_size"] == 64 and info["speculative_algorithm"] == "HISTOSPEC"
        assert info["model_path"]


def test_generate_single_has_sglang_shape(spec, tok):
    body = {"input_ids": _ids(tok, "hello"), "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "rid": "r1"}
    out = _post(spec, "/generate", body).json()
    assert isinstance(out, dict)
    meta = out["meta_info"]
    assert meta["id"] == "r1"
    assert meta["prompt_id"] == token_prompt_id(body["input_ids"])  # no custom_params.prompt_id: the derived key
    assert meta["prompt_tokens"] == len(body["input_ids"])
    assert meta["completion_tokens"] == len(out["output_ids"]) <= 6
    assert meta["finish_reason"]["type"] in ("length", "stop")
    if meta["finish_reason"]["type"] == "length":
        assert meta["finish_reason"]["length"] == 6
    for key in ("spec_verify_ct", "spec_accept_token_num", "spec_draft_token_num", "spec_accept_length"):
        assert key in meta
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)


def test_generate_text_batch_and_per_item_params(spec, tok):
    body = {
        "text": ["ab", "hello"],
        "rid": ["t0", "t1"],
        "sampling_params": [{"max_new_tokens": 3, "temperature": 0}, {"max_new_tokens": 5, "temperature": 0}],
    }
    outs = _post(spec, "/generate", body).json()
    assert [o["meta_info"]["id"] for o in outs] == ["t0", "t1"]
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(_ids(tok, "ab")), len(_ids(tok, "hello"))]
    assert len(outs[0]["output_ids"]) <= 3 and len(outs[1]["output_ids"]) <= 5


def test_stop_token_ids_and_ignore_eos(spec, tok):
    prompt = _ids(tok, "the cat")
    free = spec.client.generate([prompt], max_new_tokens=12, temperature=0, ignore_eos=True)[0]
    assert len(free["output_ids"]) == 12 and free["meta_info"]["finish_reason"]["type"] == "length"
    stop_tok = free["output_ids"][3]
    first = free["output_ids"].index(stop_tok)
    stopped = spec.client.generate([prompt], max_new_tokens=12, temperature=0, stop_token_ids=[stop_tok])[0]
    assert stopped["output_ids"] == free["output_ids"][: first + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok}


def test_logprobs_match_a_transformers_forward(spec, model_dir, tok):
    import torch
    from transformers import AutoModelForCausalLM

    prompt = _ids(tok, "abc")
    out = spec.client.generate([prompt], max_new_tokens=8, temperature=0, ignore_eos=True, return_logprob=True)[0]
    lps = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt + out["output_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    ref = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(out["output_ids"])]
    assert [lp for lp, _, _ in lps] == pytest.approx(ref, abs=1e-4)
    # greedy: every emitted token is the argmax of the reference forward
    assert out["output_ids"] == [int(logp[len(prompt) - 1 + i].argmax()) for i in range(len(out["output_ids"]))]


def test_greedy_identical_with_and_without_histospec(spec, plain, tok):
    prompts = [_ids(tok, p) for p in PROMPTS]
    pids = [f"eq-{i}" for i in range(len(prompts))]
    kw = dict(max_new_tokens=24, temperature=0, ignore_eos=True, prompt_ids=pids)
    reference = [o["output_ids"] for o in plain.client.generate(prompts, **kw)]
    # right drafts for even prompts (their own greedy output), wrong ones for odd prompts
    entries = []
    for i, (pid, ref) in enumerate(zip(pids, reference)):
        resp = ref if i % 2 == 0 else [(t * 7 + 5) % 60 + 3 for t in ref]
        entries.append({"prompt_id": pid, "responses": [resp], "prompt_tokens": prompts[i]})
    assert spec.client.push_history(0, entries) == len(entries)
    for batch in (1, 3, len(prompts)):
        for start in range(0, len(prompts), batch):
            sl = slice(start, start + batch)
            outs = spec.client.generate(prompts[sl], **{**kw, "prompt_ids": pids[sl]})
            assert [o["output_ids"] for o in outs] == reference[sl]
    outs = spec.client.generate(prompts[:1], **{**kw, "prompt_ids": pids[:1]})
    meta = outs[0]["meta_info"]
    assert meta["spec_accept_token_num"] > 0, "right history drafts must be accepted"
    assert meta["spec_verify_ct"] < meta["completion_tokens"]
    plain_meta = plain.client.generate(prompts[:1], **{**kw, "prompt_ids": pids[:1]})[0]["meta_info"]
    assert plain_meta["spec_draft_token_num"] == 0
    assert plain_meta["spec_verify_ct"] == plain_meta["completion_tokens"]  # one token per verify step
    assert plain.client.stats()["tau"] == 1.0
    assert spec.client.stats()["tau"] > 1.0


def test_history_push_stats_and_metrics(spec):
    before = spec.client.stats()
    entries = [{"prompt_id": "hist-a", "responses": [[5, 6, 7, 8], [5, 6, 9]], "rewards": [1.0, 0.0]}]
    assert _post(spec, "/histospec/history", {"step": 3, "entries": entries}).json() == {"accepted": 2}
    after = spec.client.stats()
    assert after["history"]["history_tokens"] > before["history"]["history_tokens"]
    assert after["history"]["prompts"] == before["history"]["prompts"] + 1
    assert after["history_pushes"] == before["history_pushes"] + 1
    text = httpx.get(spec.url + "/metrics").text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    stats = spec.client.stats()
    assert int(values["histospec_history_tokens"]) == stats["history"]["history_tokens"]
    assert int(values["histospec_history_bytes"]) == stats["history"]["memory_bytes"]
    assert int(values["histospec_requests_total"]) == stats["requests"]
    assert int(values["histospec_generated_tokens_total"]) == stats["generated_tokens"]
    for name in ("histospec_verify_steps_total", "histospec_draft_tokens_total", "histospec_accepted_tokens_total"):
        assert name in values
    assert float(values["histospec_tau"]) >= 1.0


def test_flush_cache_keeps_history(spec):
    before = spec.client.stats()["history"]
    r = _post(spec, "/flush_cache")
    assert r.status_code == 200
    assert spec.client.stats()["history"]["history_tokens"] == before["history_tokens"]


BIG = json.dumps({"input_ids": [1] * 300_000}).encode()  # ~900 KB .. 1.2 MB


@pytest.mark.parametrize(
    "path, payload, status, field",
    [
        ("/generate", b"{not json", 400, "body"),
        ("/generate", b"[1, 2]", 400, "body"),
        ("/generate", {"input_ids": [1, 2], "bogus": True}, 400, "bogus"),
        ("/generate", {"input_ids": [1, 2], "sampling_params": {"temprature": 0}}, 400, "sampling_params.temprature"),
        ("/generate", {"input_ids": ["a"]}, 400, "input_ids"),
        ("/generate", {"input_ids": [1, 64]}, 400, "input_ids[1]"),
        ("/generate", {"input_ids": [[1], [2, 999]]}, 400, "input_ids[1][1]"),
        ("/generate", {"input_ids": []}, 400, "input_ids"),
        ("/generate", {"text": ""}, 400, "text"),
        ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 10**6}}, 400, "max_new_tokens"),
        ("/generate", {"input_ids": [1], "sampling_params": {"top_p": 1.5}}, 400, "sampling_params.top_p"),
        ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": "4"}}, 400, "max_new_tokens"),
        ("/generate", {"input_ids": [1] * 600}, 400, "input_ids"),
        ("/generate", {"input_ids": [1], "sampling_params": {"sampling_seed": -1}}, 400, "sampling_params.sampling_seed"),
        ("/histospec/history", {"step": 1, "entries": [{"prompt_id": "z", "responses": [[1, 70]]}]}, 400,
         "entries[0].responses[0][1]"),
        ("/histospec/history", {"step": "1", "entries": []}, 400, "step"),
        ("/histospec/history", {"step": 1, "entries": [{"prompt_id": "z", "responses": [[1]], "x": 1}]}, 400,
         "entries[0].x"),
        ("/histospec/history", {"step": 1, "entries": [{"prompt_id": "z", "responses": [[1]], "rewards": [1, 2]}]},
         400, "entries[0].rewards"),
        ("/update_weights_from_disk", {"model_path": "/nonexistent/dir"}, 400, None),
        ("/update_weights_from_disk", {"model_path": 5}, 400, "model_path"),
        ("/generate", BIG + BIG, 413, "body"),
        ("/nope", {}, 404, None),
    ],
)  # fmt: skip
def test_bad_inputs_are_4xx_naming_the_field_and_change_nothing(spec, path, payload, status, field):
    before = spec.client.stats()["history"]
    if isinstance(payload, bytes):
        r = _post(spec, path, content=payload, headers={"Content-Type": "application/json"})
    else:
        r = _post(spec, path, payload)
    assert r.status_code == status, r.text
    body = r.json()
    message = body["error"]["message"] if "error" in body else body["message"]
    if field is not None:
        assert field in message, message
    assert spec.client.stats()["history"] == before
    assert httpx.get(spec.url + "/health").status_code == 200


def test_oversized_chunked_body_is_refused(spec):
    def chunks():
        for _ in range(40):
            yield b" " * 65536

    r = httpx.post(spec.url + "/histospec/history", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert spec.client.health()


def test_history_pushed_while_requests_run(spec, tok):
    prompt = _ids(tok, "abc abc")
    results: list = []

    def run():
        results.append(
            spec.client.generate([prompt] * 4, max_new_tokens=120, temperature=1.0, seed=1, ignore_eos=True)
        )

    t = threading.Thread(target=run)
    t.start()
    pushed, pushed_while_running = 0, 0
    for step in range(30):
        pushed += spec.client.push_history(step, [{"prompt_id": f"live-{step % 5}", "responses": [[4, 5, 6, 7]]}])
        pushed_while_running += t.is_alive()
    t.join(120)
    assert pushed == 30 and pushed_while_running > 0
    [outs] = results
    assert [len(o["output_ids"]) for o in outs] == [120] * 4
    sizes = spec.client.stats()["history"]
    assert sizes["history_tokens"] > 0


def test_error_reported_by_client(spec):
    with pytest.raises(ServerError) as e:
        spec.client.generate([[1, 99]], max_new_tokens=2)
    assert e.value.status == 400 and e.value.field == "input_ids[0][1]"


def test_client_going_away_aborts_its_requests(tmp_path_factory, tok):
    # requests that run for seconds: the tiny model can finish a few hundred tokens before the disconnect is seen
    with ServerThread(long_context_model_dir(tmp_path_factory), speculative_algorithm="HISTOSPEC") as srv:
        body = {
            "input_ids": [_ids(tok, "abc")] * 3,
            "sampling_params": {"max_new_tokens": LONG_RUN_TOKENS, "ignore_eos": True, "temperature": 1.0},
        }
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/generate", json=body, timeout=0.5)
        deadline = time.monotonic() + 20
        while srv.client.stats()["requests_aborted"] < 3:
            assert time.monotonic() < deadline, "requests of a vanished client kept running"
            time.sleep(0.1)
        stats = srv.client.stats()
        assert stats["client_disconnects"] == 1 and stats["requests"] == 3
        assert stats["backend"]["engine"]["requests_running"] == 0


def test_greedy_identical_with_a_small_draft_budget_and_concurrent_clients(model_dir, plain, tok):
    prompts = [_ids(tok, p) for p in PROMPTS]
    kw = dict(max_new_tokens=16, temperature=0, ignore_eos=True)
    reference = [o["output_ids"] for o in plain.client.generate(prompts, **kw)]
    with ServerThread(model_dir, num_draft_tokens=3, draft_selection="always") as srv:
        entries = [
            {"prompt_id": f"c{i}", "responses": [r], "prompt_tokens": p}
            for i, (p, r) in enumerate(zip(prompts, reference))
        ]
        srv.client.push_history(0, entries)
        results: dict[int, list[int]] = {}

        def one(i: int) -> None:  # one HTTP call per prompt, all at once: the engine batches them
            results[i] = srv.client.generate([prompts[i]], prompt_ids=[f"c{i}"], **kw)[0]["output_ids"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [results[i] for i in range(len(prompts))] == reference
        assert srv.client.stats()["accepted_tokens"] > 0


def test_seeded_sampling_is_reproducible_with_processed_logprobs(spec, tok):
    prompt = _ids(tok, "hello")
    kw = dict(max_new_tokens=12, temperature=0.8, top_p=0.9, top_k=20, seed=123, ignore_eos=True, return_logprob=True)
    a = spec.client.generate([prompt], **kw)[0]
    b = spec.client.generate([prompt], **kw)[0]
    assert a["output_ids"] == b["output_ids"]
    lps = [lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]]
    # the second request drafts from the first one's response, so its verify passes have other shapes: the same
    # distributions up to float32 rounding of a differently shaped batch, not bit for bit
    assert lps == pytest.approx([lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]], abs=1e-5)
    assert len(lps) == 12 and all(-50 < lp <= 0 for lp in lps)


def test_parallel_samples_answer_a_list(spec, tok):
    body = {"input_ids": _ids(tok, "ab"), "rid": "par", "sampling_params": {"n": 3, "max_new_tokens": 4}}
    outs = _post(spec, "/generate", body).json()
    assert [o["meta_info"]["id"] for o in outs] == ["par_0", "par_1", "par_2"]
    assert all(1 <= len(o["output_ids"]) <= 4 for o in outs)
