"""The HTTP API (README.md, "HTTP server") over any ``Backend``: FastAPI routes, validation, auth, errors; no torch.

Routes: ``POST /generate`` (SGLang's native shapes), the history routes (``history_routes``, shared with SGLang's
server), ``GET /metrics``, ``GET /health``, ``GET /get_model_info`` (also ``/model_info``),
``POST /update_weights_from_disk``, ``POST|GET /flush_cache``, ``POST /abort_request``. With an admin key, the
routes of ``http_api.ADMIN_ROUTES`` need ``Authorization: Bearer KEY``. Every bad input gets a 4xx with
``{"error": {"message": "<field>: <what is wrong>", "field": "<field>"}}`` and changes nothing (``http_api``).

Example::

    app = create_app(backend, AppConfig(admin_api_key="s3cret"))
    uvicorn.run(app, host="127.0.0.1", port=30000)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sglang_histospec.engine.types import GenerateRequest
from sglang_histospec.server.history_routes import history_router
from sglang_histospec.server.http_api import (
    ApiError,
    ApiGuard,
    check_admin_key,
    install_error_handlers,
    weight_update_error,
)
from sglang_histospec.server.json_body import JsonRoute
from sglang_histospec.server.metrics import ServerCounters, prometheus_text
from sglang_histospec.server.protocol import Backend, BackendError, GenerationOutput
from sglang_histospec.server.schemas import (
    AbortRequestBody,
    GenerateBody,
    RequestLimits,
    UpdateWeightsFromDiskBody,
    is_batch,
    to_generate_requests,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class AppConfig:
    """Settings of the HTTP layer (the backend has its own)."""

    admin_api_key: str | None = None
    """When set, admin routes (history, end_step, weights, flush, abort) need ``Authorization: Bearer KEY``."""
    max_request_bytes: int = 64 * 2**20
    """Larger request bodies get HTTP 413 (split big history pushes; the client does)."""
    disconnect_poll_s: float = 0.5
    """How often a waiting /generate checks whether its client went away (then its requests are aborted)."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """Limits on what a client controls (text length, batch size, n, ids, entries per push)."""

    def __post_init__(self) -> None:
        check_admin_key(self.admin_api_key)
        if self.max_request_bytes < 1:
            raise ValueError(f"AppConfig.max_request_bytes={self.max_request_bytes!r}: must be >= 1")


def _sglang_item(out: GenerationOutput, req: GenerateRequest, with_token_text: bool, backend: Backend) -> dict:
    """One element of SGLang's /generate response."""
    n = len(out.output_ids)
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": n,
        "cached_tokens": 0,
        "weight_version": out.weight_version,
        "e2e_latency": out.e2e_latency,
        "spec_verify_ct": out.spec_verify_ct,
        "spec_draft_token_num": out.spec_draft_token_num,
        "spec_accept_token_num": out.spec_accept_token_num,
        "spec_accept_rate": out.spec_accept_token_num / out.spec_draft_token_num if out.spec_draft_token_num else 0.0,
        "spec_accept_length": n / out.spec_verify_ct if out.spec_verify_ct else 1.0,
        "prompt_id": req.prompt_id,
    }
    if req.return_logprob:
        logprobs = out.output_token_logprobs or []
        texts = [backend.decode([t]) for t in out.output_ids] if with_token_text else [None] * n
        meta["output_token_logprobs"] = [[lp, tok, txt] for lp, tok, txt in zip(logprobs, out.output_ids, texts)]
    return {"text": out.text, "output_ids": out.output_ids, "meta_info": meta}


def create_app(backend: Backend, config: AppConfig | None = None) -> FastAPI:
    """Build the FastAPI app serving ``backend``; the app calls ``backend.shutdown()`` when it stops."""
    config = config or AppConfig()
    counters = ServerCounters()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await backend.shutdown()

    def on_error(status: int) -> None:
        if 400 <= status < 500:
            counters.add("bad_requests")

    app = FastAPI(title="sglang-histospec rollout server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.router.route_class = JsonRoute  # 415 for a body that is not JSON, 400 for a repeated key
    app.state.backend = backend
    app.state.counters = counters
    app.add_middleware(
        ApiGuard, admin_api_key=config.admin_api_key, max_request_bytes=config.max_request_bytes, on_error=on_error
    )
    install_error_handlers(app, on_error)
    _add_generate_route(app, backend, config, counters)
    app.include_router(history_router(backend, counters, config.limits))
    _add_status_routes(app, backend, counters)
    _add_admin_routes(app, backend, counters, on_error)
    return app


def _add_generate_route(app: FastAPI, backend: Backend, config: AppConfig, counters: ServerCounters) -> None:
    """``POST /generate``: convert and validate once (off the loop: tokenizing, big batches), generate (aborted if the
    client goes away), answer."""

    @app.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> Response:
        received = time.time()
        limits = backend.limits()
        tokenize = backend.tokenize if limits.has_tokenizer else None
        # the client limits are checked before tokenizing; both run off the event loop: /health stays responsive
        reqs = await asyncio.to_thread(to_generate_requests, body, limits, tokenize, config.limits)
        outputs = await _generate_until_disconnect(backend, reqs, request, config.disconnect_poll_s, counters)
        for out in outputs:
            counters.observe(
                prompt_tokens=out.prompt_tokens,
                completion_tokens=len(out.output_ids),
                verify_steps=out.spec_verify_ct,
                drafted=out.spec_draft_token_num,
                accepted=out.spec_accept_token_num,
                finish_type=str(out.finish_reason.get("type")),
            )
        items = [_sglang_item(o, r, body.return_text_in_logprobs, backend) for o, r in zip(outputs, reqs)]
        answered = time.time()
        for item in items:  # wall clock of this server (HistoPipe measures busy time from it)
            item["meta_info"]["server_received"], item["meta_info"]["server_answered"] = received, answered
        return JSONResponse(items if is_batch(body) or len(items) > 1 else items[0])


async def _generate_until_disconnect(
    backend: Backend, reqs: list[GenerateRequest], request: Request, poll_s: float, counters: ServerCounters
) -> list[GenerationOutput]:
    """``backend.generate(reqs)``; if the client goes away meanwhile, its requests are aborted (they finish with
    what they have) and the disconnect is counted."""
    task = asyncio.ensure_future(backend.generate(reqs))
    while not task.done():
        await asyncio.wait({task}, timeout=poll_s)
        if not task.done() and await request.is_disconnected():
            # nobody will read the answer: stop the work
            await backend.abort([item.rid for item in reqs])
            await asyncio.wait({task})
            counters.add("client_disconnects")
    return task.result()


def _add_status_routes(app: FastAPI, backend: Backend, counters: ServerCounters) -> None:
    """``GET /metrics``, ``GET /health``, ``GET /get_model_info`` (also ``/model_info``)."""

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        backend_stats = await backend.stats()
        text = prometheus_text(counters, backend_stats.get("history"), backend_stats.get("gauges"))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health")
    async def health() -> Response:
        problem = backend.health_problem()
        if problem is None:
            return Response(status_code=200)
        raise ApiError(503, problem)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict:
        return backend.model_info()


def _add_admin_routes(
    app: FastAPI, backend: Backend, counters: ServerCounters, on_error: Callable[[int], None]
) -> None:
    """SGLang's admin routes: ``POST /update_weights_from_disk``, ``GET|POST /flush_cache``, ``POST /abort_request``."""

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskBody) -> JSONResponse:
        version = None if body.weight_version is None else str(body.weight_version)
        try:
            message = await backend.update_weights_from_disk(
                body.model_path, body.flush_cache, version, body.abort_all_requests
            )
        except BackendError as exc:
            on_error(exc.status)
            return weight_update_error(exc)
        counters.add("weight_updates")
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        message = await backend.flush_cache()
        return PlainTextResponse(message)

    @app.post("/abort_request")
    async def abort_request(body: AbortRequestBody) -> dict:
        """SGLang's route: abort one request by ``rid`` (its /generate answers with finish type abort), or all."""
        if body.abort_all:
            await backend.abort_all()
        elif body.rid:
            await backend.abort(body.rid if isinstance(body.rid, list) else [body.rid])
        else:
            raise ApiError(400, "rid: send a request id, or abort_all=true", "rid")
        return {"success": True}
