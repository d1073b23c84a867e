"""HTTP routes of the HistoPipe router (``histospec route``) over a :class:`Router`: the API of a rollout server,
complete, plus the router's own routes (``/histopipe/step``, ``/histopipe/drain``, ``/histopipe/stats``).

Request models, validation, auth, limits and the error format are the server's (``server/schemas.py``,
``server/http_api.py``), not copies. Which route goes where: :func:`create_app`; the API: README, "HistoPipe:
balancing rollout workers".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from sglang_histospec.router.config import RouterError
from sglang_histospec.router.router import Router
from sglang_histospec.server.http_api import ApiError, ApiGuard, install_error_handlers, weight_update_error
from sglang_histospec.server.json_body import JsonRoute
from sglang_histospec.server.schemas import (
    AbortRequestBody,
    AddBackendBody,
    EndStepBody,
    GenerateBody,
    HistoryPushBody,
    StepBody,
    UpdateWeightsFromDiskBody,
)

DISCONNECT_POLL_S = 0.5


async def _run_cancellable(request: Request, router: Router, work: Callable[[Callable], Any]) -> Any:
    """Run ``work(on_rids)`` in a thread; if the client goes away meanwhile, abort its requests on the backends."""
    rids: list[str] = []
    task = asyncio.ensure_future(asyncio.to_thread(work, rids.extend))
    aborted = False
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and not aborted and await request.is_disconnected():
            aborted = True
            await asyncio.to_thread(router.abort, list(rids))
    return task.result()


def create_app(router: Router) -> FastAPI:
    """The router's FastAPI app over ``router``.

    * Forwarded to one backend, placed per prompt: ``POST /generate`` (batch bodies split and reassembled; ``n``
      samples of a prompt stay together and all come back).
    * Fanned out to every healthy backend: ``POST /histospec/history``, ``POST /histospec/end_step``,
      ``POST /update_weights_from_disk`` (remembered: a backend that comes back loads it first),
      ``GET|POST /flush_cache``, ``POST /abort_request``.
    * Answered from a backend: ``GET /get_model_info`` (also ``/model_info``).
    * Answered by the router: ``GET /health`` (``{"status": "ok" | "degraded" | "down", "backends": [{"url",
      "healthy", "problem"}], "history_replay"}``; 200 while a backend is healthy, 503 when none is),
      ``POST /histopipe/backends`` ``{"url"}`` (admin: add a rollout server; routed to once healthy and replayed),
      ``GET /histospec/stats`` (the
      servers' counters summed), ``GET /metrics`` (Prometheus, per backend), ``POST /histopipe/step``
      (``{"step", "prompts": [{"prompt_id", "input_ids"}], "group_size", "sampling_params", "return_logprob"}`` ->
      ``{"step", "results"}``, prompt i's sample j at ``i * group_size + j``), ``GET /histopipe/stats``. With
      one-step overlap (``RouterConfig.overlap``) a step answers ``{"step", "results", "deferred", "carried"}``
      (``results[i]`` null for a deferred request, answered in a later call's ``carried``) and ``POST
      /histopipe/drain`` -> ``{"carried"}`` waits for every deferred request still running.

    A client that goes away while its /generate or step runs gets its requests aborted on the backends.
    """
    app = FastAPI(title="histospec router", docs_url=None, redoc_url=None)
    app.router.route_class = JsonRoute  # as a server's: 415 for a body that is not JSON, 400 for a repeated key
    app.add_middleware(
        ApiGuard,
        admin_api_key=router.config.admin_api_key,
        max_request_bytes=router.config.max_request_bytes,
        on_error=lambda status: None,
    )
    install_error_handlers(app, on_error=lambda status: None)
    _add_generation_routes(app, router)
    _add_fan_out_routes(app, router)
    _add_router_routes(app, router)
    return app


def _add_generation_routes(app: FastAPI, router: Router) -> None:
    """``/histopipe/step``, ``/histopipe/drain``, ``/generate``: a client that goes away gets its requests aborted."""

    @app.post("/histopipe/step")
    async def step(body: StepBody, request: Request) -> dict[str, Any]:
        def work(on_rids: Callable) -> dict[str, Any]:
            return router.step(body, on_rids)

        return await _run_cancellable(request, router, work)

    @app.post("/histopipe/drain")
    def drain() -> dict[str, Any]:
        return {"carried": router.drain()}

    @app.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> Any:
        return await _run_cancellable(request, router, lambda on_rids: router.generate(body, on_rids))


def _add_fan_out_routes(app: FastAPI, router: Router) -> None:
    """The routes fanned out to every healthy backend, and model info from one."""

    @app.post("/histospec/history")
    def history(body: HistoryPushBody) -> dict[str, Any]:
        return router.push_history(body)

    @app.post("/histospec/end_step")
    def end_step(body: EndStepBody) -> dict[str, Any]:
        return router.end_step(body.step)

    @app.post("/update_weights_from_disk")
    def update_weights_from_disk(body: UpdateWeightsFromDiskBody) -> JSONResponse:
        try:
            return JSONResponse(router.update_weights(body.model_dump(exclude_unset=True)))
        except ApiError as exc:
            return weight_update_error(exc)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    def flush_cache() -> PlainTextResponse:
        return PlainTextResponse(router.flush_cache())

    @app.post("/abort_request")
    def abort_request(body: AbortRequestBody) -> dict[str, Any]:
        if not body.abort_all and not body.rid:
            raise RouterError(400, "rid: send a request id, or abort_all=true", "rid")
        return {"success": True, "backends": router.fan_out_raw("/abort_request", body.model_dump())}

    @app.get("/get_model_info")
    @app.get("/model_info")
    def model_info() -> Any:
        return router.backend_get("/get_model_info")


def _add_router_routes(app: FastAPI, router: Router) -> None:
    """What the router answers itself: health, backends, stats, metrics."""

    @app.get("/health")
    def health() -> JSONResponse:
        status, body = router.health()
        return JSONResponse(body, status_code=status)

    @app.post("/histopipe/backends")
    def add_backend(body: AddBackendBody) -> dict[str, Any]:
        try:
            return router.add_backend(body.url)
        except ValueError as exc:
            raise RouterError(400, str(exc), "url") from exc

    @app.get("/histospec/stats")
    def histospec_stats() -> dict[str, Any]:
        return router.histospec_stats()

    @app.get("/histopipe/stats")
    def stats() -> dict[str, Any]:
        return router.stats()

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(router.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")
