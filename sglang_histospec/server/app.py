"""The HTTP API (design.md section 6) over any ``Backend``: FastAPI routes, validation, auth, errors; no torch.

Routes: ``POST /generate`` (SGLang's native shapes), ``POST /abort_request`` (SGLang's), ``POST /histospec/history``, ``POST /histospec/end_step``,
``GET /histospec/stats``, ``GET /metrics``, ``GET /health``, ``GET /get_model_info`` (also ``/model_info``),
``POST /update_weights_from_disk``, ``POST|GET /flush_cache``. With an admin key, the abort, history, end_step, weight and
flush routes need ``Authorization: Bearer KEY``. Every bad input gets a 4xx with
``{"error": {"message": "<field>: <what is wrong>", "field": "<field>"}}`` and changes nothing.

Example::

    app = create_app(backend, AppConfig(admin_api_key="s3cret"))
    uvicorn.run(app, host="127.0.0.1", port=30000)
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang_histospec.server.metrics import ServerCounters, prometheus_text
from sglang_histospec.server.protocol import Backend, BackendError, GenerationInput, GenerationOutput
from sglang_histospec.server.schemas import (
    AbortBody,
    CustomParams,
    EndStepBody,
    FieldError,
    GenerateBody,
    HistoryEntryBody,
    HistoryPushBody,
    SamplingParamsBody,
    UpdateWeightsFromDiskBody,
    is_batch,
    to_generation_inputs,
    to_history_entries,
)

logger = logging.getLogger(__name__)

_MODELS = (
    AbortBody,
    GenerateBody,
    SamplingParamsBody,
    CustomParams,
    HistoryPushBody,
    HistoryEntryBody,
    EndStepBody,
    UpdateWeightsFromDiskBody,
)
_FIELD_NAMES = frozenset(name for model in _MODELS for name in model.model_fields)


@dataclass(slots=True)
class AppConfig:
    """Settings of the HTTP layer (the backend has its own)."""

    admin_api_key: str | None = None
    """When set, admin routes (history, end_step, weights, flush) need ``Authorization: Bearer KEY``."""
    max_request_bytes: int = 64 * 2**20
    """Larger request bodies get HTTP 413 (split big history pushes; the client does)."""
    disconnect_poll_s: float = 0.5
    """How often a waiting /generate checks whether its client went away (then its requests are aborted)."""


def error_body(message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "field": field}}


class _BodyLimit:
    """ASGI middleware: refuse bodies over ``limit`` bytes (by Content-Length, or while they stream in)."""

    def __init__(self, app: Any, limit: int, counters: ServerCounters) -> None:
        self.app, self.limit, self.counters = app, limit, counters

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(scope, receive, send)
            return
        # read the whole body first (every route reads it anyway), so an oversized stream is refused before
        # any handler runs
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # client went away
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.limit:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: dict, receive: Any, send: Any) -> None:
        self.counters.add("bad_requests")
        msg = f"request body exceeds {self.limit} bytes (server --max-request-bytes); split it into smaller requests"
        await JSONResponse(error_body(msg, "body"), status_code=413)(scope, receive, send)


def _field_path(loc: tuple, keep_last: bool) -> str:
    """``("body", "sampling_params", "SamplingParamsBody", "top_p")`` -> ``sampling_params.top_p``."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELD_NAMES or (keep_last and i == len(parts) - 1):
            out += f".{part}" if out else part
    return out or "body"


def _describe_validation(exc: RequestValidationError) -> tuple[str, str]:
    errors = exc.errors()
    if not errors:
        return "body", "invalid request"
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    err = extra[0] if extra else errors[0]
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return "body", f"body: malformed JSON ({detail})"
    if err.get("type") == "extra_forbidden":
        path = _field_path(tuple(err["loc"]), keep_last=True)
        return path, f"{path}: unknown field"
    path = _field_path(tuple(err["loc"]), keep_last=False)
    return path, f"{path}: {err.get('msg', 'invalid value')}"


def _sglang_item(out: GenerationOutput, req: GenerationInput, with_token_text: bool, backend: Backend) -> dict:
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

    app = FastAPI(title="sglang-histospec rollout server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.backend = backend
    app.state.counters = counters
    app.add_middleware(_BodyLimit, limit=config.max_request_bytes, counters=counters)

    def _bad(status: int, message: str, field: str | None) -> JSONResponse:
        if 400 <= status < 500:
            counters.add("bad_requests")
        return JSONResponse(error_body(message, field), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        field, message = _describe_validation(exc)
        return _bad(400, message, field)

    @app.exception_handler(FieldError)
    async def _on_field(request: Request, exc: FieldError) -> JSONResponse:
        return _bad(400, str(exc), exc.field)

    @app.exception_handler(BackendError)
    async def _on_backend(request: Request, exc: BackendError) -> JSONResponse:
        return _bad(exc.status, str(exc), None)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _bad(exc.status_code, str(exc.detail), None)

    def require_admin(request: Request) -> None:
        if config.admin_api_key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {config.admin_api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise StarletteHTTPException(401, "admin route: send the header 'Authorization: Bearer <admin key>'")

    admin = [Depends(require_admin)]

    @app.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> Response:
        received = time.time()
        limits = backend.limits()
        inputs = to_generation_inputs(body, limits, backend.tokenize if limits.has_tokenizer else None)
        for item in inputs:
            item.rid = item.rid or uuid.uuid4().hex
        task = asyncio.ensure_future(backend.generate(inputs))
        while not task.done():
            await asyncio.wait({task}, timeout=config.disconnect_poll_s)
            if not task.done() and await request.is_disconnected():
                # nobody will read the answer: stop the work (aborted requests finish with what they have)
                await backend.abort([item.rid for item in inputs if item.rid is not None])
                await asyncio.wait({task})
                counters.add("client_disconnects")
        outputs = task.result()
        for out in outputs:
            counters.observe(
                prompt_tokens=out.prompt_tokens,
                completion_tokens=len(out.output_ids),
                verify_steps=out.spec_verify_ct,
                drafted=out.spec_draft_token_num,
                accepted=out.spec_accept_token_num,
                finish_type=str(out.finish_reason.get("type")),
            )
        items = [_sglang_item(o, r, body.return_text_in_logprobs, backend) for o, r in zip(outputs, inputs)]
        answered = time.time()
        for item in items:  # wall clock of this server (HistoPipe measures busy time from it)
            item["meta_info"]["server_received"], item["meta_info"]["server_answered"] = received, answered
        return JSONResponse(items if is_batch(body) or len(items) > 1 else items[0])

    @app.post("/abort_request", dependencies=admin)
    async def abort_request(body: AbortBody) -> dict:
        """SGLang's abort route: the aborted request's /generate answers with its tokens so far (finish abort)."""
        if body.abort_all or not body.rid:
            raise FieldError("rid", "give the id of the request to abort (abort_all is not supported)")
        await backend.abort([body.rid])
        return {"success": True}

    @app.post("/histospec/history", dependencies=admin)
    async def push_history(body: HistoryPushBody) -> dict:
        entries = to_history_entries(body, backend.limits())
        accepted = await backend.push_history(body.step, entries)
        counters.add("history_pushes")
        counters.add("history_responses_pushed", accepted)
        return {"accepted": accepted}

    @app.post("/histospec/end_step", dependencies=admin)
    async def end_step(body: EndStepBody) -> dict:
        await backend.end_step(body.step)
        return {"success": True}

    @app.get("/histospec/stats")
    async def stats() -> dict:
        backend_stats = await backend.stats()
        return {**counters.as_dict(), "history": backend_stats.get("history", {}), "backend": backend_stats}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        backend_stats = await backend.stats()
        text = prometheus_text(counters, backend_stats.get("history"), backend_stats.get("gauges"))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health")
    async def health() -> Response:
        if backend.is_ready():
            return Response(status_code=200)
        return _bad(503, "not ready", None)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict:
        return backend.model_info()

    @app.post("/update_weights_from_disk", dependencies=admin)
    async def update_weights_from_disk(body: UpdateWeightsFromDiskBody) -> JSONResponse:
        version = None if body.weight_version is None else str(body.weight_version)
        try:
            message = await backend.update_weights_from_disk(
                body.model_path, body.flush_cache, version, body.abort_all_requests
            )
        except BackendError as exc:
            counters.add("bad_requests")
            return JSONResponse(
                {"success": False, "message": str(exc), "num_paused_requests": 0}, status_code=exc.status
            )
        counters.add("weight_updates")
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.api_route("/flush_cache", methods=["GET", "POST"], dependencies=admin)
    async def flush_cache() -> PlainTextResponse:
        message = await backend.flush_cache()
        return PlainTextResponse(message)

    return app
