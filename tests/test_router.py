"""HistoPipe router against real torch-backend rollout servers on CPU (tiny model), one killed mid-step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from fastapi.testclient import TestClient

from sglang_histospec.router.app import create_app
from sglang_histospec.router.router import Router, RouterConfig, join_generate_items, split_generate_body
from sglang_histospec.server.client import HistoSpecClient
from sglang_histospec.server.launch import free_port
from tests.server_harness import ServerThread, shared_tiny_model_dir

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
