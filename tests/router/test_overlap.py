"""One-step overlap in the router: a straggler deferred from step k keeps running and is answered with step k+1;
every answer exactly once across steps; drain returns the rest (fake servers that stall a request)."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from sglang_histospec.pipe.planner import PlannerConfig
from sglang_histospec.router.app import create_app
from sglang_histospec.router.config import RouterConfig, RouterError
from sglang_histospec.router.router import Router
from tests.helpers.fake_servers import StallServer, fake_token

N = 8  # requests per step: 7 that finish, one that stalls until released
TOKENS = 12


@pytest.fixture
def stall_servers():
    servers = [StallServer(), StallServer()]
    yield servers
    for s in servers:
        s.aborted.update(s.calls)  # let a request still stalled end
        s.stop()


def _router(servers, **planner) -> Router:
    config = RouterConfig(
        backends=[s.url for s in servers], overlap=True, planner=PlannerConfig(tail_fraction=0.5, **planner)
    )
    router = Router(config)
    router.start()
    return router


def _step(router: Router, step: int, stall: str):
    """Step ``step``: 7 prompts that finish and ``stall`` (history: 12 tokens each), seed 100 * step + i."""
    pids = [f"ok{i}" for i in range(N - 1)] + [stall]
    for pid in pids:
        router.predictor.add(pid, 0, [TOKENS] * 4)
    params = [{"max_new_tokens": TOKENS, "sampling_seed": 100 * step + i} for i in range(N)]
    rids = [f"s{step}-{i}" for i in range(N)]
    return router.overlap_step(step, [(pid, [1, 2, 3]) for pid in pids], 1, {}, rids=rids, item_params=params)


def _release(servers, pid: str) -> None:
    for s in servers:
        s.released.add(pid)


def _expected(step: int, i: int) -> list[int]:
    return [fake_token(100 * step + i, j) for j in range(TOKENS)]


def test_a_deferred_straggler_arrives_with_the_next_step_and_drain_returns_the_rest(stall_servers):
    router = _router(stall_servers)
    try:
        router.update_weights({"model_path": "/ckpt/1", "weight_version": "1"})
        first = _step(router, 1, "stall1")
        assert first.deferred == [N - 1] and first.results[N - 1] is None and first.carried == []
        for i, out in enumerate(first.results[:-1]):
            assert out is not None and out["output_ids"] == _expected(1, i)
            assert out["meta_info"]["histopipe"]["step"] == 1 and out["meta_info"]["histopipe"]["deferrals"] == 0
        assert router.deferred == 1 and router.carried() == 1
        assert "histopipe_deferred_total 1" in router.metrics_text()
        assert "histopipe_carried_requests 1" in router.metrics_text()

        _release(stall_servers, "stall1")  # the straggler goes on, under the weights it started with
        router.update_weights({"model_path": "/ckpt/2", "weight_version": "2"})
        second = _step(router, 2, "stall2")
        assert second.deferred == [N - 1] and all(o is not None for o in second.results[:-1])
        [late] = second.carried
        hp = late["meta_info"]["histopipe"]
        assert (hp["step"], hp["index"], hp["deferrals"], hp["weight_version"]) == (1, N - 1, 1, "1")
        assert late["output_ids"] == _expected(1, N - 1) and late["meta_info"]["id"] == f"s1-{N - 1}"
        assert late["meta_info"]["weight_version"] == "2"  # this fake swaps weights under running requests
        assert second.results[0]["meta_info"]["histopipe"]["weight_version"] == "2"

        _release(stall_servers, "stall2")
        [last] = router.drain()
        assert last["meta_info"]["histopipe"]["step"] == 2 and last["output_ids"] == _expected(2, N - 1)
        assert router.drain() == [] and router.carried() == 0

        # every request answered exactly once, each sent once (nothing resubmitted or lost)
        answers = [o for o in first.results + second.results if o is not None] + [late, last]
        ids = sorted(o["meta_info"]["id"] for o in answers)
        assert ids == sorted(f"s{s}-{i}" for s in (1, 2) for i in range(N))
        assert sorted(rid for s in stall_servers for rid in s.calls) == ids
        assert router.deferred == 2 and router.migrations == 0 and router.steps == 2
        assert router.predictor.predict("stall1").count == 5  # the straggler's length reached the history
    finally:
        router.close()


def test_a_carried_request_is_deferred_at_most_max_deferrals_times(stall_servers):
    """max_deferrals = 1: step 2 waits for step 1's straggler (it cannot be deferred again)."""
    router = _router(stall_servers)
    try:
        assert _step(router, 1, "stall1").deferred == [N - 1]
        got: list = []
        t = threading.Thread(target=lambda: got.append(_step(router, 2, "ok-too")))
        t.start()
        deadline = time.monotonic() + 30
        while sum(len(s.calls) for s in stall_servers) < 2 * N:  # step 2 is sent
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t.join(1.0)
        assert t.is_alive(), "step 2 returned while step 1's straggler still ran"
        _release(stall_servers, "stall1")
        t.join(30)
        [second] = got
        assert second.deferred == [] and [o["meta_info"]["histopipe"]["step"] for o in second.carried] == [1]
        assert router.drain() == []
    finally:
        router.close()


def test_max_deferrals_two_passes_a_straggler_on_twice(stall_servers):
    router = _router(stall_servers, max_deferrals=2)
    try:
        assert _step(router, 1, "stall1").deferred == [N - 1]
        second = _step(router, 2, "ok-too")
        assert second.deferred == [] and second.carried == [] and router.carried() == 1
        _release(stall_servers, "stall1")
        [late] = router.drain()
        assert late["meta_info"]["histopipe"]["deferrals"] == 2 and late["output_ids"] == _expected(1, N - 1)
    finally:
        router.close()


def test_overlap_over_http_and_sync_mode_unchanged(stall_servers):
    router = _router(stall_servers)
    try:
        client = TestClient(create_app(router))
        for pid in ("a", "stall1"):
            router.predictor.add(pid, 0, [TOKENS] * 4)
        body = {
            "step": 1,
            "prompts": [{"prompt_id": "a", "input_ids": [1, 2]}, {"prompt_id": "stall1", "input_ids": [3]}],
            "group_size": 2,
            "sampling_params": {"max_new_tokens": TOKENS, "sampling_seed": 5},
        }
        answer = client.post("/histopipe/step", json=body).json()
        assert set(answer) == {"step", "results", "deferred", "carried"} and answer["carried"] == []
        assert answer["deferred"] == [2, 3] and answer["results"][2:] == [None, None]
        assert client.get("/histopipe/stats").json()["carried"] == 2
        _release(stall_servers, "stall1")
        drained = client.post("/histopipe/drain").json()["carried"]
        assert sorted(o["meta_info"]["histopipe"]["index"] for o in drained) == [2, 3]
        with pytest.raises(RouterError, match="overlap_step"):
            router.run_step(2, [("a", [1])], 1, {})
    finally:
        router.close()
    sync = Router(RouterConfig(backends=[s.url for s in stall_servers]))
    sync.start()
    try:
        answer = TestClient(create_app(sync)).post("/histopipe/step", json={**body, "prompts": body["prompts"][:1]})
        assert set(answer.json()) == {"step", "results"}
        assert "step" not in answer.json()["results"][0]["meta_info"]["histopipe"]  # untagged, as before
        assert TestClient(create_app(sync)).post("/histopipe/drain").json() == {"carried": []}
        with pytest.raises(RouterError, match="run_step"):
            sync.overlap_step(2, [("a", [1])], 1, {})
    finally:
        sync.close()
    with pytest.raises(ValueError, match="migrate_outliers"):
        RouterConfig(backends=["http://x"], overlap=True, migrate_outliers=False)


def test_trace_path_holds_every_answer_once_a_straggler_under_its_own_step(stall_servers, tmp_path):
    """trace_path with overlap: each call appends what landed; step 1's straggler, answered in step 2's call, is
    written under step 1 (a trace out of step order is fine: the reader and replay sort it)."""
    from sglang_histospec.trace.format import load_steps

    path = tmp_path / "rollouts.jsonl"
    router = Router(
        RouterConfig(
            backends=[s.url for s in stall_servers], overlap=True, planner=PlannerConfig(tail_fraction=0.5),
            trace_path=str(path),
        )
    )  # fmt: skip
    router.start()
    try:
        first = _step(router, 1, "stall1")
        answered = sum(o is not None for o in first.results)
        assert len(path.read_text().splitlines()) == answered  # appended before the step call returned
        _release(stall_servers, "stall1")
        _step(router, 2, "stall2")
        _release(stall_servers, "stall2")
        router.drain()
    finally:
        router.close()
    steps, _ = load_steps(path)
    assert [s.step for s in steps] == [1, 2]
    for s in steps:
        assert len(s.records) == N and {r.sample for r in s.records} == {0}
        got = {r.prompt_id: r.response for r in s.records}
        pids = [f"ok{i}" for i in range(N - 1)] + [f"stall{s.step}"]
        assert got == {pid: _expected(s.step, i) for i, pid in enumerate(pids)}
    assert router.stats()["trace"] == {"records": 2 * N, "errors": 0}
