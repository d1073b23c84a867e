"""Bringing a backend back: the router keeps the history pushes of the newest steps (:class:`PushLog`, bounded) and
replays them, in arrival order, to a backend that comes back or is added, before any request is routed to it
(:func:`replay_pushes`); and the router's ``/health`` answer (:func:`health_answer`). No torch.

Example::

    log = PushLog(steps=2, max_bytes=2**20)
    log.record(3, b'{"step": 3, "entries": [...]}')
    log.record(4, b'{"step": 4, "entries": [...]}')   # steps 3 and 4 kept
    log.record(5, b'{"step": 5, "entries": [...]}')   # step 3 dropped: not current or previous any more
    [step for step, _ in log.bodies()] == [4, 5]
"""

from __future__ import annotations

from collections import deque
from typing import Any

import httpx

REPLAY_STEPS = 2
"""Default: the pushes of the current and previous steps are kept for replay."""
REPLAY_MAX_BYTES = 256 * 2**20
"""Default bound on the bytes of the kept pushes."""


class PushLog:
    """Push bodies (as sent to the backends) of the ``steps`` largest step numbers seen, in arrival order.

    Over ``max_bytes`` the oldest bodies are dropped and their steps reported as ``incomplete`` in ``stats()``: a
    backend replayed then misses them. A push for a step older than those kept is not kept.
    """

    def __init__(self, steps: int, max_bytes: int) -> None:
        if steps < 1 or max_bytes < 1:
            raise ValueError(f"PushLog(steps={steps}, max_bytes={max_bytes}): both must be >= 1")
        self.steps, self.max_bytes = steps, max_bytes
        self._bodies: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._incomplete: set[int] = set()

    def record(self, step: int, body: bytes) -> None:
        """Keep ``body``, a push for ``step``; drop what falls out of the window of steps or the byte bound."""
        window = sorted({s for s, _ in self._bodies} | {step})[-self.steps :]
        if step < window[0]:
            return
        self._bodies.append((step, body))
        self._bytes += len(body)
        if any(s < window[0] for s, _ in self._bodies):
            self._bodies = deque((s, b) for s, b in self._bodies if s >= window[0])
            self._bytes = sum(len(b) for _, b in self._bodies)
        while self._bytes > self.max_bytes:
            dropped, body = self._bodies.popleft()
            self._bytes -= len(body)
            self._incomplete.add(dropped)
        self._incomplete = {s for s in self._incomplete if s >= window[0]}

    def bodies(self) -> list[tuple[int, bytes]]:
        """(step, body) of every kept push, in arrival order."""
        return list(self._bodies)

    def stats(self) -> dict[str, Any]:
        """Kept pushes, their bytes and steps, and the steps of which pushes were dropped for ``max_bytes``."""
        return {
            "pushes": len(self._bodies),
            "bytes": self._bytes,
            "steps": sorted({s for s, _ in self._bodies}),
            "incomplete_steps": sorted(self._incomplete),
        }


def replay_pushes(http: Any, bodies: list[tuple[int, bytes]]) -> str | None:
    """POST each body to ``http`` (an ``httpx.Client`` on a backend) in order; the problem that stopped the
    replay, or None when every push was answered 200."""
    for step, body in bodies:
        try:
            response = http.post("/histospec/history", content=body)
        except httpx.HTTPError as exc:
            return f"history replay: step {step} push failed ({type(exc).__name__}: {exc})"
        if response.status_code != 200:
            return f"history replay: step {step} push answered {response.status_code} ({response.text[:200]})"
    return None


def health_answer(backends: list[dict[str, Any]], replay: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status code, body) of the router's ``GET /health``: 200 ``ok`` when every backend is healthy, 200
    ``degraded`` while at least one is, else 503 ``down`` (with the shared error object).

    Example: ``health_answer([{"url": "u", "healthy": True}], {})[1]["status"] == "ok"``.
    """
    healthy = sum(1 for b in backends if b["healthy"])
    body: dict[str, Any] = {"healthy": healthy, "backends": backends, "history_replay": replay}
    if healthy == 0:
        body["status"] = "down"
        body["error"] = {"message": "no healthy backend"}
        return 503, body
    body["status"] = "ok" if healthy == len(backends) else "degraded"
    return 200, body
