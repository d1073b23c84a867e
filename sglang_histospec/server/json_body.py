"""JSON request bodies, strictly: a body sent as another content type gets 415 naming it, and a JSON object that
repeats a key gets 400 naming the key (instead of keeping the last value). No torch.

Every route of our apps (server, router) and the history routes on SGLang's app use :class:`JsonRoute`. Example::

    app = FastAPI()
    app.router.route_class = JsonRoute   # before the routes are added
    # POST '{"text": "ab", "text": "cd"}'          -> 400 'text: duplicate JSON key "text"; send each key once'
    # POST 'a=b' (application/x-www-form-urlencoded) -> 415 naming that content type
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException


class BodyError(HTTPException):
    """A body refused before validation; ``field`` names what is wrong (a key, or ``Content-Type``)."""

    def __init__(self, status: int, field: str, detail: str) -> None:
        super().__init__(status_code=status, detail=detail)
        self.field = field


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of ``json.loads``: a dict, or BodyError for a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BodyError(400, key, f'{key}: duplicate JSON key "{key}"; send each key once')
        out[key] = value
    return out


def is_json_type(content_type: str) -> bool:
    """True for ``application/json`` and ``application/*+json`` (parameters such as charset allowed)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=_object)
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body is parsed strictly (module docstring); routes without a body are unchanged."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_json(request: Request) -> Any:
            content_type = request.headers.get("content-type")
            if content_type and not is_json_type(content_type) and await request.body():
                raise BodyError(
                    415,
                    "Content-Type",
                    f"Content-Type: {content_type!r} is not JSON; send the body as JSON with "
                    "'Content-Type: application/json'",
                )
            return await handler(_JsonRequest(request.scope, request.receive))

        return strict_json
