"""HistoPipe router against real torch-backend rollout servers on CPU (tiny model), one killed mid-step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from sglang_histospec.router.app import create_app
from sglang_histospec.router.config import RouterConfig
from sglang_histospec.router.items import join_generate_items, split_generate_body
from sglang_histospec.router.router import Router
from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.launch import free_port
from tests.helpers.server_harness import (
    LONG_RUN_TOKENS,
    ServerThread,
    long_context_model_dir,
    shared_tiny_model_dir,
)

GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [(f"p{i}", [1 + i, 5 + (i % 7), 9, 3 + (i % 5)]) for i in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def servers(model_dir: str):
    with ServerThread(model_dir, speculative_algorithm="NONE") as a, ServerThread(model_dir) as b:
        yield [a, b]


def _reference(server: ServerThread, prompts: list[tuple[str, list[int]]], params: dict) -> list[list[int]]:
    """Greedy outputs of each prompt, one request at a time, on one server."""
    outs = []
    for _, ids in prompts:
        body = {"input_ids": ids, "sampling_params": params}
        outs.append(server.client._http.post("/generate", json=body).json()["output_ids"])
    return outs


def _router(urls: list[str], **kw) -> Router:
    router = Router(RouterConfig(backends=urls, health_interval_s=0.5, **kw))
    router.start()
    return router


def test_step_results_in_request_order_across_backends(servers: list[ServerThread]) -> None:
    router = _router([s.url for s in servers])
    try:
        client = TestClient(create_app(router))
        body = {
            "step": 0,
            "prompts": [{"prompt_id": p, "input_ids": ids} for p, ids in PROMPTS],
            "group_size": 2,
            "sampling_params": GREEDY,
        }
        response = client.post("/histopipe/step", json=body)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert len(results) == len(PROMPTS) * 2
        reference = _reference(servers[0], PROMPTS, GREEDY)
        for i, out in enumerate(results):
            assert out["output_ids"] == reference[i // 2]  # prompt i, sample j at i * G + j
            assert out["meta_info"]["histopipe"]["attempts"] == 1
        used = {out["meta_info"]["histopipe"]["backend"] for out in results}
        assert used == {s.url for s in servers}  # the step was spread over both backends
        stats = client.get("/histopipe/stats").json()
        assert stats["steps"] == 1 and stats["prompts_with_history"] == len(PROMPTS)
        assert sum(b.get("requests", 0) for b in stats["backends"]) == len(results)
        metrics = client.get("/metrics").text
        assert f'histopipe_backend_requests_total{{backend="{servers[0].url}"}}' in metrics
    finally:
        router.close()


def test_generate_forwarding_and_history_fan_out(servers: list[ServerThread]) -> None:
    router = _router([s.url for s in servers])
    try:
        client = TestClient(create_app(router))
        ids = [ids for _, ids in PROMPTS[:4]]
        params = [{**GREEDY, "custom_params": {"prompt_id": p}} for p, _ in PROMPTS[:4]]
        batch = client.post("/generate", json={"input_ids": ids, "sampling_params": params})
        assert batch.status_code == 200, batch.text
        reference = _reference(servers[1], PROMPTS[:4], GREEDY)
        assert [o["output_ids"] for o in batch.json()] == reference
        single = client.post("/generate", json={"input_ids": ids[0], "sampling_params": GREEDY}).json()
        assert single["output_ids"] == reference[0]
        push = {"step": 7, "entries": [{"prompt_id": "hist-a", "responses": [[4, 5, 6, 7]], "rewards": [1.0]}]}
        answer = client.post("/histospec/history", json=push).json()
        assert answer["accepted"] == 1 and set(answer["backends"]) == {s.url for s in servers}
        for s in servers:  # every backend holds the pushed history
            assert s.client.stats()["history"]["prompts"] >= 1
        assert router.predictor.predict("hist-a").mean == 4.0
        assert client.post("/generate", json={"sampling_params": GREEDY}).status_code == 400
    finally:
        router.close()


def test_split_and_join_generate_bodies() -> None:
    body = {"input_ids": [[1], [2, 3]], "sampling_params": {"max_new_tokens": 4}, "return_logprob": [True, False]}
    items, batch = split_generate_body(body)
    assert batch and items[1] == {
        "input_ids": [2, 3],
        "sampling_params": {"max_new_tokens": 4},
        "return_logprob": False,
    }
    joined = join_generate_items(items)
    assert joined["input_ids"] == [[1], [2, 3]] and joined["return_logprob"] == [True, False]
    assert joined["sampling_params"] == [{"max_new_tokens": 4}] * 2
    assert split_generate_body({"text": "hi"}) == ([{"text": "hi"}], False)
    with pytest.raises(ValueError, match="backends"):
        RouterConfig(backends=[])


def _spawn_server(model_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_histospec.cli", "serve", "--backend", "torch", "--model", model_dir]
    cmd += ["--port", str(port), "--device", "cpu", "--speculative-algorithm", "NONE", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    with HistoSpecClient(url) as client:
        try:
            client.wait_until_ready(timeout=120)
        except TimeoutError:
            proc.kill()
            raise
    return proc, url


@pytest.mark.slow  # starts a rollout server in a subprocess (about 30 s on 2 busy vCPUs)
def test_backend_killed_mid_step_every_request_answered_once(servers: list[ServerThread], model_dir: str) -> None:
    proc, victim = _spawn_server(model_dir)
    router = _router([victim, *(s.url for s in servers)], policy="round-robin")
    try:
        client = TestClient(create_app(router))
        params = {**GREEDY, "max_new_tokens": 48}
        prompts = [(f"k{i}", [2 + i, 7, 11 + (i % 3)]) for i in range(6)]
        body = {
            "step": 1,
            "prompts": [{"prompt_id": p, "input_ids": ids} for p, ids in prompts],
            "group_size": 2,
            "sampling_params": params,
        }
        answer: dict = {}
        thread = threading.Thread(target=lambda: answer.update(r=client.post("/histopipe/step", json=body)))
        thread.start()
        deadline = time.monotonic() + 60
        while router.backends[0].outstanding <= 0:  # wait until the victim holds work of this step
            assert time.monotonic() < deadline and thread.is_alive(), "the victim never got work"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        thread.join(240)
        response = answer["r"]
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert len(results) == 12
        reference = _reference(servers[0], prompts, params)
        for i, out in enumerate(results):
            assert out["output_ids"] == reference[i // 2]
            assert out["meta_info"]["histopipe"]["backend"] != victim
        assert max(out["meta_info"]["histopipe"]["attempts"] for out in results) == 2
        stats = router.stats()["backends"]
        assert stats[0]["failures"] >= 1 and not stats[0]["healthy"]
        assert sum(b.get("resubmitted_in", 0) for b in stats[1:]) == stats[0]["failed_requests"] > 0
    finally:
        router.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


# ---- reliability (issue #16): the router is a complete, SGLang-compatible front with the server's validation ----
@pytest.fixture(scope="module")
def front(servers: list[ServerThread]):
    """A router over both test servers, as a TestClient."""
    router = _router([s.url for s in servers])
    try:
        yield router, TestClient(create_app(router))
    finally:
        router.close()


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"input_ids": [1, 5, 9], "sampling_params": {"n": 4, "sampling_seed": 3, "max_new_tokens": 6}}, 4),
        ({"input_ids": [[1, 5], [2, 7]], "sampling_params": {"n": 3, "sampling_seed": 5, "max_new_tokens": 5}}, 6),
        ({"text": ["ab", "cd"], "rid": "t", "sampling_params": {"n": 2, "sampling_seed": 1, "max_new_tokens": 4}}, 4),
        ({"input_ids": [1, 5], "sampling_params": {"n": 1, "max_new_tokens": 3, "temperature": 0}}, 1),
    ],
)
def test_router_answers_every_parallel_sample_like_a_server(front, servers, body, expected) -> None:
    _, client = front
    direct = servers[0].client._http.post("/generate", json=body).json()
    routed = client.post("/generate", json=body)
    assert routed.status_code == 200, routed.text
    out = routed.json()
    if expected == 1:
        assert isinstance(out, dict) and out["output_ids"] == direct["output_ids"]
        return
    assert isinstance(out, list) and len(out) == expected == len(direct)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in direct]  # seeded: seed + j, prompt-major
    if "rid" in body:
        assert [o["meta_info"]["id"] for o in out] == [o["meta_info"]["id"] for o in direct]


def _server_routes(app) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes if hasattr(r, "methods") for m in r.methods if m not in ("HEAD",)}


def test_router_has_every_server_route(front, servers) -> None:
    router, _ = front
    missing = _server_routes(servers[0].app) - _server_routes(create_app(router))
    assert not missing, f"server routes the router does not serve: {sorted(missing)}"


@pytest.mark.parametrize(
    "method, path, body, check",
    [
        ("GET", "/get_model_info", None, lambda j: j["vocab_size"] == 64 and j["is_generation"]),
        ("GET", "/model_info", None, lambda j: j["vocab_size"] == 64),
        ("GET", "/histospec/stats", None, lambda j: "history" in j and "tau" in j and len(j["per_backend"]) == 2),
        ("POST", "/flush_cache", None, lambda t: "flushed" in t.lower()),
        ("GET", "/flush_cache", None, lambda t: "flushed" in t.lower()),
        ("POST", "/histospec/end_step", {"step": None}, lambda j: j["success"] is True),
        ("POST", "/abort_request", {"rid": "nothing-runs"}, lambda j: j["success"] is True),
        ("POST", "/update_weights_from_disk", "MODEL", lambda j: j["success"] is True and len(j["backends"]) == 2),
    ],
)
def test_router_forwards_or_answers_every_route(front, model_dir, method, path, body, check) -> None:
    _, client = front
    if body == "MODEL":
        body = {"model_path": model_dir, "weight_version": "0"}
    r = client.request(method, path, json=body)
    assert r.status_code == 200, (path, r.text)
    assert check(r.json() if r.headers["content-type"].startswith("application/json") else r.text), r.text


@pytest.mark.parametrize(
    "body",
    [
        {"step": -1, "entries": [{"prompt_id": "rej-a", "responses": [[4, 5]]}]},
        {"step": 1, "entries": [{"prompt_id": "rej-b", "responses": [[4, 999]]}]},
        {"step": 1, "entries": [{"prompt_id": "rej-c", "responses": [[4, 5]], "bogus": 1}]},
        {"step": 1, "entries": [{"prompt_id": "rej-d", "responses": [[4, 5]], "rewards": [1, 2]}]},
        {"step": True, "entries": [{"prompt_id": "rej-e", "responses": [[4, 5]]}]},
        {"step": 1, "entries": [{"prompt_id": "x" * 600, "responses": [[4, 5]]}]},
    ],
)
def test_router_push_refused_by_validation_changes_nothing(front, servers, body) -> None:
    router, client = front
    before = (router.stats()["prompts_with_history"], [s.client.stats()["history"] for s in servers])
    r = client.post("/histospec/history", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"].startswith(("step", "entries")), r.text
    assert (router.stats()["prompts_with_history"], [s.client.stats()["history"] for s in servers]) == before


def test_router_push_refused_by_the_backends_changes_nothing(model_dir) -> None:
    with ServerThread(model_dir, speculative_algorithm="NONE", admin_api_key="k1") as srv:
        router = _router([srv.url], admin_api_key="k2")  # the backend refuses the router's key: 401
        try:
            client = TestClient(create_app(router))
            push = {"step": 1, "entries": [{"prompt_id": "rej-auth", "responses": [[4, 5]]}]}
            r = client.post("/histospec/history", json=push, headers={"Authorization": "Bearer k2"})
            assert r.status_code == 401, r.text
            assert router.stats()["prompts_with_history"] == 0
        finally:
            router.close()


BAD_GENERATE = [
    {"text": "\ud800"},
    {"text": ["ok", "\udfff x"]},
    {"input_ids": [1, True]},
    {"input_ids": [1, 2], "bogus": 1},
    {"input_ids": [1, 2], "sampling_params": {"n": 0}},
    {"input_ids": [1, 2], "sampling_params": {"n": 5000}},
    {"input_ids": [1, 2], "sampling_params": "x"},
    {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": True}},
    {"input_ids": [1, 99]},
    {"input_ids": [[1], [2]], "rid": ["a", "a"]},
    {"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 3}]},
    {"input_ids": [1, 2], "rid": "r" * 600},
    {"input_ids": [1, 2], "sampling_params": {"custom_params": {"prompt_id": "p" * 600}}},
    {"input_ids": [1, 2], "sampling_params": {"top_p": 2}},
    {"input_ids": [1, 2], "sampling_params": {"sampling_seed": 2**70}},
    {"input_ids": [1, 2], "sampling_params": {"sampling_seed": -1}},
    {"text": "ab", "sampling_params": {"seed": -2}},
    {"input_ids": []},
    {},
]


@pytest.mark.parametrize("body", BAD_GENERATE)
def test_router_refuses_bad_generate_exactly_like_a_server(front, servers, body) -> None:
    _, client = front
    content = json.dumps(body).encode()  # lone surrogates as JSON escapes, as a client would send them
    headers = {"Content-Type": "application/json"}
    direct = servers[0].client._http.post("/generate", content=content, headers=headers)
    routed = client.post("/generate", content=content, headers=headers)
    assert direct.status_code == routed.status_code == 400, (direct.text, routed.text)
    assert routed.json() == direct.json()
    assert routed.json()["error"]["field"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "sampling_params": "x"}, "sampling_params"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "group_size": 100_000}, "group_size"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "group_size": True}, "group_size"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "group_size": 0}, "group_size"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}] * 20, "group_size": 1000}, "group_size"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "step": -1}, "step"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 2]}], "bogus": 1}, "bogus"),
        ({"prompts": [{"prompt_id": "a", "input_ids": [1, 200]}]}, "input_ids"),
        ({"prompts": [{"prompt_id": "\ud800", "input_ids": [1, 2]}]}, "prompts"),
        ({"prompts": []}, "prompts"),
    ],
)
def test_router_step_bad_inputs_are_4xx_naming_the_field(front, body, field) -> None:
    router, client = front
    before = router.stats()
    r = client.post("/histopipe/step", content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["field"], r.text
    assert router.stats() == before


def test_router_auth_runs_before_the_body_and_accepts_any_scheme_case(servers) -> None:
    router = _router([s.url for s in servers], admin_api_key=None)
    try:
        with pytest.raises(ValueError, match="non-blank"):
            RouterConfig(backends=["http://127.0.0.1:1"], admin_api_key="   ")
    finally:
        router.close()
    with ServerThread(
        servers[0].backend.config.engine.model_path, speculative_algorithm="NONE", admin_api_key="k"
    ) as s:
        router = _router([s.url], admin_api_key="k")
        try:
            client = TestClient(create_app(router))
            for target in (client, httpx.Client(base_url=s.url)):
                bad = target.post(
                    "/histospec/history", content=b"{not json", headers={"Content-Type": "application/json"}
                )
                assert bad.status_code == 401 and bad.json()["error"]["field"] == "Authorization", bad.text
                ok = target.post("/histospec/end_step", json={"step": None}, headers={"Authorization": "bearer k"})
                assert ok.status_code == 200, ok.text
        finally:
            router.close()


@pytest.fixture(scope="module")
def long_server(tmp_path_factory):
    """A plain server whose requests of LONG_RUN_TOKENS tokens run for seconds (disconnects land while they run)."""
    with ServerThread(long_context_model_dir(tmp_path_factory), speculative_algorithm="NONE") as srv:
        yield srv


def test_router_client_going_away_aborts_backend_work(long_server) -> None:
    import uvicorn

    router = _router([long_server.url])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(router), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        before = long_server.client.stats()["requests_aborted"]
        body = {
            "input_ids": [[1, 5, 6]] * 2,
            "sampling_params": {"max_new_tokens": LONG_RUN_TOKENS, "ignore_eos": True},
        }
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=0.5)
        deadline = time.monotonic() + 30
        while long_server.client.stats()["requests_aborted"] < before + 2:
            assert time.monotonic() < deadline, "backend work of a vanished router client kept running"
            time.sleep(0.1)
    finally:
        server.should_exit = True
        thread.join(30)
        router.close()


def test_router_shutdown_fails_running_calls_at_once(long_server) -> None:
    from sglang_histospec.router.config import RouterError

    router = _router([long_server.url])
    got: list = []

    def run() -> None:
        body = {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": LONG_RUN_TOKENS, "ignore_eos": True}}
        try:
            got.append(router.generate(body))
        except RouterError as exc:
            got.append(exc)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while router.backends[0].outstanding <= 0:
        assert time.monotonic() < deadline and t.is_alive()
        time.sleep(0.01)
    t0 = time.monotonic()
    router.begin_shutdown()  # what SIGTERM calls
    t.join(30)
    router.close()
    # at once: the backend's answer is seconds away (LONG_RUN_TOKENS), the call fails within a poll or two
    assert time.monotonic() - t0 < 2 and isinstance(got[0], RouterError) and got[0].status == 503, got


def test_trace_path_records_step_calls_and_plain_generate_and_replays(servers, tmp_path, capsys) -> None:
    """RouterConfig.trace_path (``histospec route --trace-path``): a step call and a plain /generate each append
    their answers (logprobs kept); the trace loads and `histospec replay` runs on it."""
    from sglang_histospec.cli import main
    from sglang_histospec.trace.format import load_steps

    path = tmp_path / "rollouts.jsonl.gz"
    router = _router([s.url for s in servers], trace_path=str(path))
    try:
        client = TestClient(create_app(router))
        body = {
            "prompts": [{"prompt_id": p, "input_ids": ids} for p, ids in PROMPTS[:3]],
            "group_size": 2,
            "sampling_params": GREEDY,
            "return_logprob": True,
        }
        assert client.post("/histopipe/step", json=body).status_code == 200
        plain = {"input_ids": [ids for _, ids in PROMPTS[:2]], "sampling_params": GREEDY}
        answers = client.post("/generate", json=plain).json()
    finally:
        router.close()
    steps, _ = load_steps(path)
    assert [s.step for s in steps] == [0, 1]  # the plain call: the router's step count (no weight version sent)
    assert [(r.prompt_id, r.sample) for r in steps[0].records] == [(p, j) for p, _ in PROMPTS[:3] for j in (0, 1)]
    assert all(r.logprobs is not None and len(r.logprobs) == len(r.response) == 12 for r in steps[0].records)
    assert [r.response for r in steps[1].records] == [a["output_ids"] for a in answers]
    capsys.readouterr()
    assert main(["replay", str(path), "--drafter", "histospec", "--budget", "8", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["responses"] == 8 and out["tau"] >= 1.0


def test_plain_generate_answers_take_the_weight_version_as_step() -> None:
    from sglang_histospec.router.trace_log import plain_step

    assert (plain_step("7", 2), plain_step(None, 2), plain_step("ckpt-a", 2)) == (7, 2, 2)
