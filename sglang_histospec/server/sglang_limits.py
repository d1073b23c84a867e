"""Our server's durability and client limits on SGLang's HTTP server (``server/sglang_backend.py``); no SGLang or
torch import.

``--histospec-*`` arguments (:func:`split_histospec_args`) are taken out of SGLang's argument list:
``--histospec-history-dir DIR`` (the workers' write-ahead log and snapshots, ``plugin/durable.py``),
``--histospec-max-request-bytes N`` and one ``--histospec-<limit>`` per ``RequestLimits`` field. On SGLang's app,
:func:`install_guards` adds the body-size limit (413) to every route and the client limits of ``/generate``
(:func:`check_raw_generate`, 400 in the shared error format); the history routes apply ``RequestLimits`` as ours do.
Example::

    config, sglang_argv = split_histospec_args(["--model-path", "m", "--histospec-max-text-chars", "100"])
    config.limits.max_text_chars == 100 and sglang_argv == ["--model-path", "m"]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from sglang_histospec.server.http_api import ApiGuard, error_body, read_body, replay_receive
from sglang_histospec.server.json_body import is_json_type
from sglang_histospec.server.schemas import FieldError, RequestLimits

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


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def check_raw_generate(raw: Any, limits: RequestLimits) -> None:
    """The client limits of a ``/generate`` body as SGLang receives it (a dict; SGLang checks its own shapes).
    FieldError names the field and the limit, worded as our server words it.

    Example: ``check_raw_generate({"text": "x" * 11}, RequestLimits(max_text_chars=10))`` raises
    ``FieldError("text", "has 11 characters; the limit is 10 (max_text_chars)")``.
    """
    if not isinstance(raw, dict):
        return
    text, ids = raw.get("text"), raw.get("input_ids")
    name = "text" if text is not None else "input_ids"
    batch = isinstance(text, list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))
    n = len(text if text is not None else ids) if batch else 1
    if n > limits.max_prompts:
        raise FieldError(name, f"has {n} prompts; the limit is {limits.max_prompts} (max_prompts)")
    chars = sum(len(t) for t in _as_list(text) if isinstance(t, str))
    if chars > limits.max_text_chars:
        raise FieldError("text", f"has {chars} characters; the limit is {limits.max_text_chars} (max_text_chars)")
    params = [p for p in _as_list(raw.get("sampling_params")) if isinstance(p, dict)]
    samples = [p.get("n", 1) for p in params]
    for i, k in enumerate(samples):
        if not isinstance(k, int) or not 1 <= k <= limits.max_n:
            raise FieldError(f"sampling_params[{i}].n", f"must be in [1, {limits.max_n}] (max_n), got {k!r}")
    if n * max(samples, default=1) > limits.max_samples:
        raise FieldError("sampling_params.n", f"asks for more than {limits.max_samples} samples (max_samples)")
    ids_given = [("rid", r) for r in _as_list(raw.get("rid"))]
    ids_given += [("custom_params.prompt_id", (p.get("custom_params") or {}).get("prompt_id")) for p in params]
    for where, value in ids_given:
        if isinstance(value, str) and len(value) > limits.max_id_chars:
            raise FieldError(where, f"has {len(value)} characters; the limit is {limits.max_id_chars} (max_id_chars)")


class GenerateLimitsGuard:
    """ASGI middleware on SGLang's app: ``POST /generate`` bodies over the client limits get 400 (shared format)."""

    def __init__(self, app: Any, limits: RequestLimits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") != "/generate":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # client went away
        problem = self._problem(scope, body)
        if problem is not None:
            await JSONResponse(error_body(str(problem), problem.field), status_code=400)(scope, receive, send)
            return
        await self.app(scope, replay_receive(body, receive), send)

    def _problem(self, scope: dict, body: bytes) -> FieldError | None:
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1")
        if content_type and not is_json_type(content_type):
            return None  # SGLang answers bodies that are not JSON itself
        try:
            check_raw_generate(json.loads(body), self.limits)
        except FieldError as exc:
            return exc
        except ValueError:
            return None
        return None


def install_guards(app: Any, config: SGLangServeConfig) -> None:
    """Add the body-size limit (every route) and the ``/generate`` client limits to SGLang's FastAPI ``app``."""
    app.add_middleware(GenerateLimitsGuard, limits=config.limits)
    app.add_middleware(ApiGuard, admin_api_key=None, max_request_bytes=config.max_request_bytes, on_error=_no_count)


def _no_count(status: int) -> None:
    """SGLang's app keeps its own counters."""
