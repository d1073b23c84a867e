"""A backend that comes back or is added gets the history pushes it missed before it is routed to; the router's
/health names every backend and a degraded state (issue 44)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.router.app import create_app
from sglang_histospec.router.config import RouterConfig
from sglang_histospec.router.recovery import PushLog, health_answer
from sglang_histospec.router.router import Router
from tests.helpers.server_harness import ServerThread, shared_tiny_model_dir


def _reference_kept(events: list[tuple[int, int]], steps: int, max_bytes: int) -> list[tuple[int, int]]:
    """What ``PushLog`` keeps, written plainly: (step, size) in arrival order."""
    kept: list[tuple[int, int]] = []
    for step, size in events:
        window = sorted({s for s, _ in kept} | {step})[-steps:]
        if step < window[0]:
            continue
        kept = [(s, n) for s, n in [*kept, (step, size)] if s >= window[0]]
        while sum(n for _, n in kept) > max_bytes:
            kept.pop(0)
    return kept


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    events=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 40)), max_size=30),
    steps=st.integers(1, 3),
    max_bytes=st.integers(1, 200),
)
def test_push_log_matches_its_reference(events, steps, max_bytes) -> None:
    log = PushLog(steps, max_bytes)
    for step, size in events:
        log.record(step, b"x" * size)
    assert [(s, len(b)) for s, b in log.bodies()] == _reference_kept(events, steps, max_bytes)
    assert log.stats()["bytes"] <= max_bytes


HEALTH = [
    # healthy flags -> status code, body status
    ([True, True], 200, "ok"),
    ([True, False], 200, "degraded"),
    ([False, False], 503, "down"),
]


@pytest.mark.parametrize(("flags", "code", "status"), HEALTH)
def test_health_answer(flags, code, status) -> None:
    backends = [{"url": f"http://b{i}", "healthy": f, "problem": None if f else "down"} for i, f in enumerate(flags)]
    got_code, body = health_answer(backends, {})
    assert (got_code, body["status"], body["healthy"]) == (code, status, sum(flags))
    assert [b["url"] for b in body["backends"]] == ["http://b0", "http://b1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return shared_tiny_model_dir(tmp_path_factory)


def _push(client: TestClient, step: int) -> None:
    body = {"step": step, "entries": [{"prompt_id": f"p{step}", "responses": [[4, 5, 6, step + 7]]}]}
    r = client.post("/histospec/history", json=body)
    assert r.status_code == 200, r.text


def _visits(srv: ServerThread) -> list[bool]:
    return [srv.backend.engine.drafter.has_visit(f"p{s}", s) for s in range(1, 4)]


def test_restarted_backend_gets_the_last_two_steps_replayed_before_it_is_healthy(model_dir) -> None:
    a = ServerThread(model_dir, speculative_algorithm="NONE")
    b = ServerThread(model_dir, speculative_algorithm="NONE")
    router = Router(RouterConfig(backends=[a.url, b.url], health_interval_s=3600))
    router.start()
    client = TestClient(create_app(router))
    try:
        for step in (1, 2, 3):
            _push(client, step)
        b.stop()
        router.check_health()
        r = client.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "degraded", r.text
        assert [x["healthy"] for x in r.json()["backends"]] == [True, False]
        assert r.json()["backends"][1]["problem"]
        b = ServerThread(model_dir, speculative_algorithm="NONE", port=b.port)  # empty history
        assert _visits(b) == [False, False, False]
        router.check_health()
        assert _visits(b) == [False, True, True]  # steps 2 and 3: the current and previous step
        r = client.get("/health")
        assert r.json()["status"] == "ok" and r.json()["history_replay"]["steps"] == [2, 3]
        assert router.stats()["backends"][1]["replayed_pushes"] == 2
        a.stop()
        router.check_health()
        assert client.get("/health").status_code == 200
        b.stop()
        router.check_health()
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "down"
    finally:
        router.close()
        a.stop()
        b.stop()


def test_added_backend_is_replayed_then_routed_to(model_dir) -> None:
    with (
        ServerThread(model_dir, speculative_algorithm="NONE") as a,
        ServerThread(model_dir, speculative_algorithm="NONE") as c,
    ):
        router = Router(RouterConfig(backends=[a.url], health_interval_s=3600))
        router.start()
        client = TestClient(create_app(router))
        try:
            _push(client, 2)
            _push(client, 3)
            r = client.post("/histopipe/backends", json={"url": c.url})
            assert r.status_code == 200 and r.json()["healthy"], r.text
            assert _visits(c) == [False, True, True]
            r = client.post("/histopipe/backends", json={"url": c.url})
            assert r.status_code == 400 and r.json()["error"]["field"] == "url"
            assert len(client.get("/health").json()["backends"]) == 2
        finally:
            router.close()
