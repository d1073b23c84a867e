"""HTTP routes of the HistoPipe router (``histospec route``) over a :class:`Router`.

* ``POST /histopipe/step``: ``{"step": int, "prompts": [{"prompt_id": str, "input_ids": [int]}], "group_size": G,
  "sampling_params": {...}, "return_logprob": bool}`` -> ``{"step", "results": [item]}`` with prompt i's sample j
  at index ``i * G + j`` (items as SGLang's /generate returns them, plus ``meta_info.histopipe``).
* ``POST /generate``: SGLang's body, forwarded with per-prompt placement (batch bodies split and reassembled).
* ``POST /histospec/history``, ``POST /histospec/end_step``: fanned out to every healthy backend.
* ``GET /health`` (200 while a backend is healthy), ``GET /histopipe/stats`` (JSON), ``GET /metrics``
  (Prometheus, per backend).
Blocking work runs in FastAPI's thread pool (the routes are plain functions).
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sglang_histospec.router.router import Router, RouterError


def create_app(router: Router) -> FastAPI:
    app = FastAPI(title="histospec router")

    @app.exception_handler(RouterError)
    def _router_error(request: Request, exc: RouterError) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "field": None}}, status_code=exc.status)

    def require_admin(request: Request) -> None:
        key = router.config.admin_api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise RouterError(401, "admin route: send the header 'Authorization: Bearer <admin key>'")

    admin = [Depends(require_admin)]

    @app.post("/histopipe/step")
    def step(body: dict[str, Any]) -> dict[str, Any]:
        prompts = body.get("prompts")
        if not isinstance(prompts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("prompt_id"), str) and isinstance(p.get("input_ids"), list)
            for p in prompts
        ):
            raise RouterError(400, "'prompts' must be a list of {'prompt_id': str, 'input_ids': [int]}")
        step_no = body.get("step", router.steps)
        if not isinstance(step_no, int) or step_no < 0:
            raise RouterError(400, f"step={step_no!r}: must be an int >= 0")
        results = router.run_step(
            step_no,
            [(p["prompt_id"], p["input_ids"]) for p in prompts],
            body.get("group_size", 1),
            body.get("sampling_params") or {},
            bool(body.get("return_logprob", False)),
        )
        return {"step": step_no, "results": results}

    @app.post("/generate")
    def generate(body: dict[str, Any]) -> Any:
        return router.generate(body)

    @app.post("/histospec/history", dependencies=admin)
    def history(body: dict[str, Any]) -> dict[str, Any]:
        step_no, entries = body.get("step"), body.get("entries")
        if not isinstance(step_no, int) or not isinstance(entries, list):
            raise RouterError(400, "history push: need {'step': int, 'entries': [...]}")
        return router.push_history(step_no, entries)

    @app.post("/histospec/end_step", dependencies=admin)
    def end_step(body: dict[str, Any] | None = None) -> dict[str, Any]:
        return router.end_step((body or {}).get("step"))

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200 if router.healthy() else 503)

    @app.get("/histopipe/stats")
    def stats() -> dict[str, Any]:
        return router.stats()

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(router.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
