"""Our server's durability and client limits on SGLang's HTTP server (``server/sglang_backend.py``); no SGLang or
torch import.

``--histospec-*`` arguments (:func:`split_histospec_args`) are taken out of SGLang's argument list:
``--histospec-history-dir DIR`` (the workers' write-ahead log and snapshots, ``plugin/durable.py``),
``--histospec-max-request-bytes N`` and one ``--histospec-<limit>`` per ``RequestLimits`` field. On SGLang's app,
:func:`install_guards` adds the body-size limit (413) to every route and the torch backend's checks to ``/generate``
and the OpenAI generation routes (:func:`check_raw_generate`: vocabulary, shapes, seeds, prompt ids, sampling
values and client limits; 400 in the shared error format); the history routes apply ``RequestLimits`` as ours do.
Example::

    config, sglang_argv = split_histospec_args(["--model-path", "m", "--histospec-max-text-chars", "100"])
    config.limits.max_text_chars == 100 and sglang_argv == ["--model-path", "m"]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from sglang_histospec.server.http_api import ApiGuard, describe_validation, error_body, read_body, replay_receive
from sglang_histospec.server.json_body import is_json_type
from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import FieldError, GenerateBody, RequestLimits, SamplingParamsBody
from sglang_histospec.server.sglang_schemas import check_completion, check_sglang_generate

PREFIX = "--histospec-"


@dataclass(slots=True)
class SGLangServeConfig:
    """What ``histospec serve --backend sglang`` adds around SGLang's own server."""

    history_dir: str | None = None
    """The workers' history directory (restored at start, every push logged before it is answered); None = memory."""
    max_request_bytes: int = 64 * 2**20
    """Larger request bodies get HTTP 413, on every route."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """Client limits of ``/generate`` and the history routes (as on our server)."""

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1:
            raise ValueError(f"--histospec-max-request-bytes {self.max_request_bytes}: must be >= 1")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(PREFIX + "history-dir", dest="history_dir", default=None)
    parser.add_argument(PREFIX + "max-request-bytes", dest="max_request_bytes", type=int, default=64 * 2**20)
    for f in dataclasses.fields(RequestLimits):
        parser.add_argument(PREFIX + f.name.replace("_", "-"), dest=f.name, type=int, default=f.default)
    return parser


def split_histospec_args(argv: list[str]) -> tuple[SGLangServeConfig, list[str]]:
    """(our config, SGLang's arguments) of a command line; ValueError for a bad value of ours."""
    try:
        ours, rest = _parser().parse_known_args(argv)
    except SystemExit as exc:  # argparse already printed what is wrong
        raise ValueError("bad --histospec-* argument (see above)") from exc
    names = [f.name for f in dataclasses.fields(RequestLimits)]
    limits = RequestLimits(**{n: getattr(ours, n) for n in names})
    return SGLangServeConfig(ours.history_dir, ours.max_request_bytes, limits), rest


def histospec_argv(config: SGLangServeConfig) -> list[str]:
    """The ``--histospec-*`` arguments that give ``config`` back (the inverse of :func:`split_histospec_args`)."""
    out = [] if config.history_dir is None else [PREFIX + "history-dir", config.history_dir]
    out += [PREFIX + "max-request-bytes", str(config.max_request_bytes)]
    for f in dataclasses.fields(RequestLimits):
        out += [PREFIX + f.name.replace("_", "-"), str(getattr(config.limits, f.name))]
    return out


GENERATE_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
"""SGLang's generation routes whose bodies :class:`GenerateGuard` checks."""

ModelFacts = Callable[[], tuple[ModelLimits, bool] | None]
"""The served model's limits and whether the context length is enforced (False under SGLang's
``--allow-auto-truncate``); None while SGLang is still starting."""


def check_raw_generate(
    path: str, raw: Any, limits: RequestLimits, model: ModelLimits | None = None, check_context: bool = True
) -> None:
    """The torch backend's checks of a generation body (``path``: one of ``GENERATE_PATHS``) as SGLang receives it:
    FieldError or ``pydantic.ValidationError`` naming the field, worded as our server words it
    (``sglang_schemas.check_sglang_generate``, ``sglang_schemas.check_completion``).

    Example: ``check_raw_generate("/generate", {"text": "x" * 11}, RequestLimits(max_text_chars=10))`` raises
    ``FieldError("text", "has 11 characters; the limit is 10 (max_text_chars)")``.
    """
    if path == "/generate":
        check_sglang_generate(raw, limits, model, check_context)
    else:
        check_completion(raw, limits, model)


class GenerateGuard:
    """ASGI middleware on SGLang's app: a bad body of a generation route (``GENERATE_PATHS``) gets a 400 in the
    shared error format before SGLang's tokenizer manager or scheduler sees it (an id outside the vocabulary would
    crash SGLang's scheduler, docs/reliability.md); the 4xx answers SGLang gives itself are rewritten into the same
    format (:func:`shared_errors`)."""

    def __init__(self, app: Any, limits: RequestLimits, model: ModelFacts | None = None) -> None:
        self.app, self.limits, self.model = app, limits, model

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "").rstrip("/")
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT") or path not in GENERATE_PATHS:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # client went away
        problem = self._problem(scope, path, body)
        if problem is not None:
            field, message = problem
            await JSONResponse(error_body(message, field), status_code=400)(scope, receive, send)
            return
        await self.app(scope, replay_receive(body, receive), shared_errors(send))

    def _problem(self, scope: dict, path: str, body: bytes) -> tuple[str, str] | None:
        """(field, message) of what is wrong with ``body``; None: SGLang gets it."""
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1")
        if content_type and not is_json_type(content_type):
            return None  # SGLang answers bodies that are not JSON itself
        try:
            raw = json.loads(body)
        except ValueError:
            return "body", "body: malformed JSON; send one JSON object"
        facts = None if self.model is None else self.model()
        model, check_context = (None, True) if facts is None else facts
        try:
            check_raw_generate(path, raw, self.limits, model, check_context)
        except FieldError as exc:
            return exc.field, str(exc)
        except ValidationError as exc:
            return describe_validation(exc)
        return None


_SAMPLING_FIELDS = frozenset(SamplingParamsBody.model_fields)
_BODY_FIELDS = frozenset(GenerateBody.model_fields) | {"prompt", "messages", "max_tokens", "max_completion_tokens"}


def shared_error(body: bytes) -> bytes:
    """One of SGLang's own 4xx bodies (``{"error": {"message"}}``, ``{"error": "..."}``, ``{"object": "error",
    "message"}``) in the shared format; the field is the one the message starts with (``top_p must be in (0, 1]``
    -> ``sampling_params.top_p``), else ``body``. A body already in the shared format is kept.

    Example: ``shared_error(b'{"error": {"message": "top_p must be in (0, 1], got 2."}}')`` is
    ``{"error": {"message": "sampling_params.top_p: top_p must be in (0, 1], got 2.", "field": "sampling_params.top_p"}}``.
    """
    try:
        raw = json.loads(body)
    except ValueError:
        raw = None
    error = raw.get("error") if isinstance(raw, dict) else None
    if isinstance(error, dict) and "field" in error:
        return body
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = error["message"]
    elif isinstance(error, str):
        message = error
    elif isinstance(raw, dict) and isinstance(raw.get("message"), str):
        message = raw["message"]
    else:
        message = body.decode("utf-8", "replace") or "invalid request"
    message = message.split("\n\n  File ", 1)[0].strip()  # SGLang appends a traceback to some messages
    word = re.match(r"[A-Za-z_]+", message)
    name = word.group(0) if word else ""
    field = f"sampling_params.{name}" if name in _SAMPLING_FIELDS else name if name in _BODY_FIELDS else "body"
    return json.dumps(error_body(f"{field}: {message}", field)).encode()


def shared_errors(send: Any) -> Any:
    """An ASGI ``send`` that answers SGLang's own 4xx responses in the shared format (:func:`shared_error`)."""
    held: dict | None = None
    chunks: list[bytes] = []

    async def send_shared(message: dict) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
            held = message
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = shared_error(b"".join(chunks))
        headers = [(k, v) for k, v in held.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({**held, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return send_shared


def install_guards(app: Any, config: SGLangServeConfig, model: ModelFacts | None = None) -> None:
    """Add the body-size limit (every route) and the checks of the generation routes (:class:`GenerateGuard`, with
    the served model's facts from ``model``) to SGLang's FastAPI ``app``."""
    app.add_middleware(GenerateGuard, limits=config.limits, model=model)
    app.add_middleware(ApiGuard, admin_api_key=None, max_request_bytes=config.max_request_bytes, on_error=_no_count)


def _no_count(status: int) -> None:
    """SGLang's app keeps its own counters."""
