"""The HTTP conventions of the rollout API, written once and shared by the server and the router; no torch.

* Errors: every 4xx/5xx body is ``{"error": {"message": "<field>: <what is wrong>", "field": "<field>"}}``
  (``field`` only where one value is to blame), built by :func:`error_body`.
* Auth: with an admin key, the routes in ``ADMIN_ROUTES`` need ``Authorization: Bearer KEY`` (scheme
  case-insensitive); it is checked by :class:`ApiGuard` before the body is read, so an unauthenticated client
  cannot make the server parse anything.
* Size: bodies over ``max_request_bytes`` get 413 before any handler runs.

Example::

    app = FastAPI()
    install_error_handlers(app, on_error=lambda status: None)
    app.add_middleware(ApiGuard, admin_api_key="s3cret", max_request_bytes=2**20, on_error=lambda status: None)
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang_histospec.server.protocol import BackendError
from sglang_histospec.server.schemas import MODELS, FieldError

ADMIN_ROUTES = frozenset(
    {"/histospec/history", "/histospec/end_step", "/update_weights_from_disk", "/flush_cache", "/abort_request"}
)
"""Routes that change server state (history, weights, caches, other clients' requests)."""
_FIELD_NAMES = frozenset(name for model in MODELS for name in model.model_fields)


class ApiError(Exception):
    """An HTTP error answered in the shared format: ``ApiError(404, "path: no route /x", "path")``."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def error_body(message: str, field: str | None = None) -> dict[str, Any]:
    """The error JSON; strings that are not valid UTF-8 (lone surrogates) are escaped so the body always encodes.

    Example: ``error_body("top_p: must be in (0, 1]", "sampling_params.top_p")``.
    """
    err: dict[str, Any] = {"message": _printable(message)}
    if field is not None:
        err["field"] = _printable(field)
    return {"error": err}


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_admin_key(key: str | None) -> str | None:
    """Validate an admin key setting: None (no auth) or a non-blank string without surrounding whitespace."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip() or key != key.strip():
        raise ValueError(
            "admin_api_key must be a non-blank string without leading or trailing whitespace "
            "(or unset for no auth); pick a random token, e.g. `openssl rand -hex 16`"
        )
    return key


def bearer_matches(header: str, key: str) -> bool:
    """True when ``header`` is ``Bearer <key>`` (scheme in any case, one or more spaces)."""
    scheme, _, token = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


class ApiGuard:
    """ASGI middleware: auth of ``ADMIN_ROUTES`` (before reading the body), then the body-size limit."""

    def __init__(
        self, app: Any, admin_api_key: str | None, max_request_bytes: int, on_error: Callable[[int], None]
    ) -> None:
        self.app, self.key, self.limit, self.on_error = (
            app,
            check_admin_key(admin_api_key),
            max_request_bytes,
            on_error,
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.key is not None and scope.get("path", "").rstrip("/") in ADMIN_ROUTES:
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not bearer_matches(given, self.key):
                msg = "Authorization: admin route; send the header 'Authorization: Bearer <admin key>'"
                await self._reject(scope, receive, send, 401, msg, "Authorization")
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
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
                await self._too_large(scope, receive, send)
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

    async def _too_large(self, scope: dict, receive: Any, send: Any) -> None:
        msg = f"body: request body exceeds {self.limit} bytes (--max-request-bytes); split it into smaller requests"
        await self._reject(scope, receive, send, 413, msg, "body")

    async def _reject(self, scope: dict, receive: Any, send: Any, status: int, msg: str, field: str) -> None:
        self.on_error(status)
        await JSONResponse(error_body(msg, field), status_code=status)(scope, receive, send)


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


def describe_validation(exc: RequestValidationError) -> tuple[str, str]:
    """(field, message) of the first problem of a pydantic body validation, unknown fields first."""
    errors = exc.errors()
    if not errors:
        return "body", "body: invalid request"
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    err = extra[0] if extra else errors[0]
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return "body", f"body: malformed JSON ({detail})"
    if err.get("type") == "extra_forbidden":
        path = _field_path(tuple(err["loc"]), keep_last=True)
        return path, f"{path}: unknown field"
    if err.get("type") == "missing" and tuple(err.get("loc", ())) == ("body",):
        return "body", "body: a JSON object is required"
    path = _field_path(tuple(err["loc"]), keep_last=False)
    return path, f"{path}: {err.get('msg', 'invalid value')}"


_HTTP_FIELDS = {401: "Authorization", 404: "path", 405: "method", 413: "body"}


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None]) -> None:
    """Answer every error in the shared format; ``on_error(status)`` counts it."""

    def answer(status: int, message: str, field: str | None) -> JSONResponse:
        on_error(status)
        return JSONResponse(error_body(message, field), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        field, message = describe_validation(exc)
        return answer(400, message, field)

    @app.exception_handler(FieldError)
    async def _on_field(request: Request, exc: FieldError) -> JSONResponse:
        return answer(400, str(exc), exc.field)

    @app.exception_handler(ApiError)
    async def _on_api(request: Request, exc: ApiError) -> JSONResponse:
        return answer(exc.status, exc.message, exc.field)

    @app.exception_handler(BackendError)
    async def _on_backend(request: Request, exc: BackendError) -> JSONResponse:
        return answer(exc.status, str(exc), getattr(exc, "field", None))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = _HTTP_FIELDS.get(exc.status_code)
        detail = str(exc.detail)
        if exc.status_code == 404:
            detail = f"path: no route {request.url.path}"
        elif exc.status_code == 405:
            detail = f"method: {request.method} is not allowed on {request.url.path}"
        elif exc.status_code == 400:
            field, detail = "body", f"body: {detail}"
        return answer(exc.status_code, detail, field)
