"""The history routes, written once for every host app: ours (``server/app.py``) and SGLang's
(``server/sglang_backend.py``), over any ``HistoryBackend``.

``POST /histospec/history``, ``POST /histospec/end_step`` and ``GET /histospec/stats`` (bodies, auth and errors:
:func:`history_router`; README, "HTTP server"). Example::

    app.include_router(history_router(backend, counters, RequestLimits()))
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from fastapi import APIRouter, Depends

from sglang_histospec.server.http_api import SharedErrorsRoute, admin_dependency
from sglang_histospec.server.json_body import JsonRoute
from sglang_histospec.server.protocol import HistoryBackend
from sglang_histospec.server.schemas import EndStepBody, HistoryPushBody, RequestLimits, to_history_entries


class PushCounters(Protocol):
    """What the history routes count (``metrics.ServerCounters`` or ``metrics.HistoryCounters``)."""

    def observe_push(self, stored: int, replaced: int) -> None: ...

    def as_dict(self) -> dict[str, Any]: ...


def history_router(
    backend: HistoryBackend,
    counters: PushCounters,
    limits: RequestLimits,
    *,
    foreign_host: bool = False,
    admin_api_key: str | None = None,
) -> APIRouter:
    """The three history routes over ``backend``. ``foreign_host``: the router goes into an app whose middleware
    and error handlers are not ours, so it checks ``admin_api_key`` and answers its errors itself.

    * ``POST /histospec/history`` ``{"step", "entries": [{"prompt_id", "responses", "rewards"?, "prompt_tokens"?}]}``
      -> ``{"accepted": n}``;
    * ``POST /histospec/end_step`` ``{"step": int | null}`` -> ``{"success": true}``: close the drafter's open step;
    * ``GET /histospec/stats`` -> the host's counters, ``history`` (the drafter's stats) and ``backend``.

    Auth and errors follow ``http_api``: on our apps ``ApiGuard`` and the app's error handlers do it; on a host app
    that is not ours, ``admin_api_key`` adds the same check as a dependency and the routes answer their own errors.
    """
    if foreign_host:
        router = APIRouter(route_class=SharedErrorsRoute)
        admin = [Depends(admin_dependency(admin_api_key))]
    else:
        router, admin = APIRouter(route_class=JsonRoute), []

    @router.post("/histospec/history", dependencies=admin)
    async def push_history(body: HistoryPushBody) -> dict:
        entries = await asyncio.to_thread(to_history_entries, body, backend.limits(), limits)
        accepted, replaced = await backend.push_history(body.step, entries)
        counters.observe_push(accepted, replaced)
        return {"accepted": accepted}

    @router.post("/histospec/end_step", dependencies=admin)
    async def end_step(body: EndStepBody) -> dict:
        await backend.end_step(body.step)
        return {"success": True}

    @router.get("/histospec/stats")
    async def stats() -> dict:
        backend_stats = await backend.stats()
        return {
            **counters.as_dict(),
            "history": backend_stats.get("history", {}),
            "backend": backend_stats.get("backend", backend_stats),
        }

    return router
