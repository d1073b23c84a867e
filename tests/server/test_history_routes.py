"""The shared history routes on a host app that is not ours (as on SGLang's server), over a fake HistoryBackend:
the same bodies, auth and error format as the torch server, without SGLang."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sglang_histospec.server.history_routes import history_router
from sglang_histospec.server.metrics import HistoryCounters
from sglang_histospec.server.protocol import BackendError, HistoryBackend, ModelLimits
from sglang_histospec.server.schemas import RequestLimits

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}


class FakeSGLang:
    """Answers like ``SGLangBackend``: stored responses, never replaced; its own ``backend`` entry in stats."""

    def __init__(self) -> None:
        self.pushed: list[tuple[int, list]] = []
        self.failure: str | None = None

    def limits(self) -> ModelLimits:
        return ModelLimits(vocab_size=64, context_len=128)

    async def push_history(self, step, entries):
        if self.failure:
            raise BackendError(self.failure, status=400)
        self.pushed.append((step, entries))
        return sum(len(e.responses) for e in entries), 0

    async def end_step(self, step):
        if self.failure:
            raise BackendError(self.failure, status=400)

    async def stats(self):
        if self.failure:
            raise BackendError(self.failure, status=503)
        return {"history": {"prompts": len(self.pushed)}, "backend": {"name": "sglang", "algorithm": "HISTOSPEC"}}


@pytest.fixture
def host():
    backend = FakeSGLang()
    app = FastAPI()  # a host whose error handlers are FastAPI's defaults (422 validation bodies, {"detail": ...})
    app.include_router(
        history_router(backend, HistoryCounters(), RequestLimits(), foreign_host=True, admin_api_key=KEY)
    )
    with TestClient(app) as client:
        yield client, backend


def test_fake_is_a_history_backend():
    assert isinstance(FakeSGLang(), HistoryBackend)


def test_push_end_step_and_stats_bodies(host):
    client, backend = host
    body = {"step": 3, "entries": [{"prompt_id": "p", "responses": [[5, 6], [7]], "rewards": [1.0, 0.0]}]}
    r = client.post("/histospec/history", json=body, headers=AUTH)
    assert (r.status_code, r.json()) == (200, {"accepted": 2})
    assert backend.pushed[0][1][0].responses == [[5, 6], [7]]
    r = client.post("/histospec/end_step", json={"step": None}, headers=AUTH)
    assert (r.status_code, r.json()) == (200, {"success": True})
    assert client.get("/histospec/stats").json() == {
        "history_pushes": 1,
        "history_responses_pushed": 2,
        "history": {"prompts": 1},
        "backend": {"name": "sglang", "algorithm": "HISTOSPEC"},
    }


def test_auth_and_validation_answer_in_the_shared_format(host):
    client, backend = host
    r = client.post("/histospec/history", json={"step": 0, "entries": []}, headers={"Authorization": "Bearer x"})
    assert r.status_code == 401
    assert r.json() == {
        "error": {
            "message": "Authorization: admin route; send the header 'Authorization: Bearer <admin key>'",
            "field": "Authorization",
        }
    }
    r = client.post("/histospec/history", json={"step": -1, "entries": []}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["field"] == "step"
    r = client.post("/histospec/history", json={"step": 0, "entries": [], "extra": 1}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"] == {"message": "extra: unknown field", "field": "extra"}
    bad_token = {"step": 0, "entries": [{"prompt_id": "p", "responses": [[64]]}]}
    r = client.post("/histospec/history", json=bad_token, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["field"].startswith("entries[0].responses")
    assert backend.pushed == []


def test_backend_failures_keep_their_status_and_name_no_field(host):
    client, backend = host
    backend.failure = "no answer from the SGLang schedulers within 120.0 s"
    for path, body in [("/histospec/history", {"step": 1, "entries": []}), ("/histospec/end_step", {"step": 1})]:
        r = client.post(path, json=body, headers=AUTH)
        assert (r.status_code, r.json()) == (400, {"error": {"message": backend.failure}})
    r = client.get("/histospec/stats")
    assert (r.status_code, r.json()) == (503, {"error": {"message": backend.failure}})
