"""The HTTP conventions of the rollout API, written once and shared by the server and the router; no torch.

Errors: every 4xx/5xx body is ``{"error": {"message": "<field>: <what is wrong>", "field": "<field>"}}``
(:func:`error_body`). Auth: with an admin key, ``ADMIN_ROUTES`` need ``Authorization: Bearer KEY``
(:func:`check_admin`; in our apps :class:`ApiGuard`, on a host app we do not own :func:`admin_dependency` and
:class:`SharedErrorsRoute`). Size: bodies over ``max_request_bytes`` get 413. README, "Durability and limits".

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

from sglang_histospec.server.json_body import JsonRoute
from sglang_histospec.server.protocol import BackendError
from sglang_histospec.server.schemas import MODELS, FieldError
from sglang_histospec.server.sglang_schemas import SGLANG_MODELS

ADMIN_ROUTES = frozenset(
    {
        "/histospec/history",
        "/histospec/end_step",
        "/update_weights_from_disk",
        "/flush_cache",
        "/abort_request",
        "/histopipe/backends",
    }
)
"""Routes that change server state (history, weights, caches, other clients' requests)."""
_FIELD_NAMES = frozenset(name for model in MODELS + SGLANG_MODELS for name in model.model_fields)


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


def check_admin(header: str, key: str | None) -> None:
    """Raise the 401 ``ApiError`` of an admin route unless ``key`` is None or ``header`` is ``Bearer <key>``."""
    if key is not None and not bearer_matches(header, key):
        msg = "Authorization: admin route; send the header 'Authorization: Bearer <admin key>'"
        raise ApiError(401, msg, "Authorization")


def admin_dependency(key: str | None) -> Callable[[Request], None]:
    """A FastAPI dependency running :func:`check_admin` (for routes on a host app without :class:`ApiGuard`)."""

    def require_admin(request: Request) -> None:
        check_admin(request.headers.get("authorization", ""), key)

    return require_admin


class ApiGuard:
    """ASGI middleware: auth of ``ADMIN_ROUTES`` (before reading the body), then the body-size limit.

    Auth runs before the body is read, so an unauthenticated client cannot make the server parse anything; bodies
    over ``max_request_bytes`` get 413 before any handler runs.
    """

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
        if scope.get("path", "").rstrip("/") in ADMIN_ROUTES:
            try:
                check_admin(headers.get(b"authorization", b"").decode("latin-1"), self.key)
            except ApiError as exc:
                await self._reject(scope, receive, send, exc.status, exc.message, exc.field)
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
            return
        # read the whole body first (every route reads it anyway), so an oversized stream is refused before
        # any handler runs
        try:
            body = await read_body(receive, self.limit)
        except ValueError:
            await self._too_large(scope, receive, send)
            return
        if body is not None:
            await self.app(json_by_default(scope, body), replay_receive(body, receive), send)

    async def _too_large(self, scope: dict, receive: Any, send: Any) -> None:
        msg = f"body: request body exceeds {self.limit} bytes (--max-request-bytes); split it into smaller requests"
        await self._reject(scope, receive, send, 413, msg, "body")

    async def _reject(self, scope: dict, receive: Any, send: Any, status: int, msg: str, field: str | None) -> None:
        self.on_error(status)
        await JSONResponse(error_body(msg, field), status_code=status)(scope, receive, send)


def json_by_default(scope: dict, body: bytes) -> dict:
    """``scope`` with ``Content-Type: application/json`` added when a request has a body but no Content-Type (the
    API takes only JSON bodies, so such a body is read as JSON, as ``curl --data-binary`` users expect)."""
    headers = list(scope.get("headers") or [])
    if not body or any(name.lower() == b"content-type" for name, _ in headers):
        return scope
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


async def read_body(receive: Any, limit: int | None = None) -> bytes | None:
    """The whole body of an ASGI request (None when the client went away); ValueError past ``limit`` bytes."""
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        received += len(chunk)
        if limit is not None and received > limit:
            raise ValueError(f"body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay_receive(body: bytes, receive: Any) -> Callable:
    """An ASGI ``receive`` that gives ``body`` (read by :func:`read_body`) as one message, then defers to
    ``receive`` (for the disconnect)."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


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


_KINDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}
"""Pydantic's type errors, as the JSON kind they ask for."""


def _json_kind(value: Any) -> str:
    kinds = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _type_message(path: str, errors: list[dict]) -> str | None:
    """``path: must be a number, got a string`` when every error at ``path`` is a type error (one per branch of a
    union such as ``int | float``); None otherwise."""
    kinds = [_KINDS.get(str(e.get("type"))) for e in errors]
    if not kinds or None in kinds:
        return None
    wanted = list(dict.fromkeys(k for k in kinds if k is not None))
    if "a number" in wanted and "an integer" in wanted:  # an int | float union: a JSON number
        wanted.remove("an integer")
    return f"{path}: must be {' or '.join(wanted)}, got {_json_kind(errors[0].get('input'))}"


def describe_validation(exc: Any) -> tuple[str, str]:
    """(field, message) of the first problem of a pydantic validation (a ``RequestValidationError`` or a
    ``pydantic.ValidationError``), unknown fields first; a value of the wrong type says which kind it must be
    (``entries[0].rewards[0]: must be a number, got a string``)."""
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
    same = [e for e in errors if _field_path(tuple(e["loc"]), keep_last=False) == path]
    return path, _type_message(path, same) or f"{path}: {err.get('msg', 'invalid value')}"


_HTTP_FIELDS = {401: "Authorization", 404: "path", 405: "method", 413: "body", 415: "Content-Type"}
_HANDLED = (RequestValidationError, FieldError, ApiError, BackendError, StarletteHTTPException)
"""The exceptions answered in the shared format."""


def describe_error(request: Request, exc: Exception) -> tuple[int, str, str | None]:
    """(status, message, field) of one of the ``_HANDLED`` exceptions raised while serving ``request``."""
    if isinstance(exc, RequestValidationError):
        field, message = describe_validation(exc)
        return 400, message, field
    if isinstance(exc, FieldError):
        return 400, str(exc), exc.field
    if isinstance(exc, ApiError):
        return exc.status, exc.message, exc.field
    if isinstance(exc, BackendError):
        return exc.status, str(exc), getattr(exc, "field", None)
    assert isinstance(exc, StarletteHTTPException), type(exc)
    field = getattr(exc, "field", None)  # json_body.BodyError names it and writes the whole message
    if field is not None:
        return exc.status_code, str(exc.detail), field
    field = _HTTP_FIELDS.get(exc.status_code)
    detail = str(exc.detail)
    if exc.status_code == 404:
        detail = f"path: no route {request.url.path}"
    elif exc.status_code == 405:
        detail = f"method: {request.method} is not allowed on {request.url.path}"
    elif exc.status_code == 400:
        field, detail = "body", f"body: {detail}"
    return exc.status_code, detail, field


def error_response(request: Request, exc: Exception, on_error: Callable[[int], None]) -> JSONResponse:
    """The shared error answer to ``exc``; ``on_error(status)`` counts it."""
    status, message, field = describe_error(request, exc)
    on_error(status)
    return JSONResponse(error_body(message, field), status_code=status)


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None]) -> None:
    """Answer every error in the shared format; ``on_error(status)`` counts it."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request, exc, on_error)

    for exc_type in _HANDLED:
        app.add_exception_handler(exc_type, handle)


class SharedErrorsRoute(JsonRoute):
    """A route that answers its own errors (validation, auth, backend) in the shared format, for routes added to
    a host app whose exception handlers are not ours (SGLang's): ``APIRouter(route_class=SharedErrorsRoute)``."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def answer_errors_here(request: Request) -> Any:
            try:
                return await handler(request)
            except _HANDLED as exc:
                return error_response(request, exc, lambda status: None)

        return answer_errors_here


def weight_update_error(exc: ApiError | BackendError) -> JSONResponse:
    """A failed ``/update_weights_from_disk``: SGLang's shape plus the shared error object."""
    message = exc.message if isinstance(exc, ApiError) else str(exc)
    answer = {"success": False, "message": message, "num_paused_requests": 0}
    return JSONResponse({**answer, **error_body(message, exc.field)}, status_code=exc.status)
