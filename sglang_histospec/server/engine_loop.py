"""The one thread that drives a step-wise engine; everything else talks to it through a command queue.

Commands (requests, history pushes, weight updates, flushes) run between two engine steps, never inside one
(ordering, barriers and durability: :class:`EngineLoop`). Example::

    loop = EngineLoop(engine, history=DurableHistory("/tmp/h"))
    loop.start()
    fut = loop.submit_request(GenerateRequest(rid="a", input_ids=[1, 2]))   # concurrent.futures.Future
    result = fut.result()
    loop.call(lambda e: e.drafter.add("p0", 1, [[5, 6]]), changes_history=True).result()
    loop.stop()
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_histospec.server.protocol import BackendUnavailable

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Command:
    fn: Callable[[Any], Any]
    future: concurrent.futures.Future
    barrier: bool = False
    changes_history: bool = False


@dataclass(slots=True)
class _Pending:
    future: concurrent.futures.Future
    submitted: float = field(default_factory=time.monotonic)


class EngineLoop:
    """Owns ``engine`` from ``start()`` to ``stop()``; no other thread may touch it.

    Loop: run the queued commands in order (new requests, history pushes, end_step, weight updates, flushes), then
    one ``engine.step()``; repeat. So a history push is applied between two engine steps, never inside one. A
    *barrier* command (weight update, flush) waits at the head of the queue until the engine holds no request, and
    the commands behind it wait too: requests sent after a weight update run entirely on the new weights, requests
    sent before it entirely on the old ones.

    The engine is duck-typed (``add_request``, ``step``, ``has_unfinished``, ``abort``, ``drafter``); no torch import.
    With a ``history`` (``drafting.history_log.DurableHistory``) every change is logged durably by the command that makes
    it; this thread compacts the log into a snapshot ``snapshot_debounce_s`` after the first change that is not in
    one, retries a failed snapshot after as long again, and writes a last one at ``stop()``.
    """

    def __init__(
        self, engine: Any, *, history: Any = None, snapshot_debounce_s: float = 2.0, idle_wait_s: float = 0.05
    ) -> None:
        self.engine = engine
        self.history = history
        self.snapshot_debounce_s = snapshot_debounce_s
        self._idle_wait_s = idle_wait_s
        self._queue: collections.deque[_Command] = collections.deque()
        self._cond = threading.Condition()
        self._pending: dict[str, _Pending] = {}
        self._stopping = False
        self._failed: str | None = None
        self._draining = False
        self._dirty_since: float | None = None
        self.snapshots_written = 0
        self._thread = threading.Thread(target=self._run, name="histospec-engine", daemon=True)

    # ---- public API (any thread) -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def failed(self) -> str | None:
        """Why the engine stopped serving (an exception inside ``step``), or None."""
        return self._failed

    @property
    def degraded(self) -> str | None:
        """Why the history is not being saved (the last log or snapshot write failed), or None."""
        return None if self.history is None else self.history.problem

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping and not self._draining and self._failed is None

    def begin_shutdown(self) -> None:
        """Refuse new work and abort what runs or waits (its answers go out now); ``stop()`` follows."""
        with self._cond:
            self._draining = True
        self.call(lambda engine: [engine.abort(rid) for rid in list(self._pending)], internal=True)

    def call(
        self,
        fn: Callable[[Any], Any],
        *,
        barrier: bool = False,
        changes_history: bool = False,
        internal: bool = False,
    ) -> concurrent.futures.Future:
        """Run ``fn(engine)`` on the engine thread between steps; the future holds its result or exception.
        ``barrier``: wait until the engine is idle first. ``changes_history``: schedule a snapshot."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping or self._failed is not None or (self._draining and not internal):
                fut.set_exception(BackendUnavailable(self._failed or "server is shutting down"))
                return fut
            self._queue.append(_Command(fn, fut, barrier, changes_history))
            self._cond.notify()
        return fut

    def submit_request(self, request: Any) -> concurrent.futures.Future:
        """Queue a request (an object with ``rid``); the future resolves to its result when it finishes."""
        result: concurrent.futures.Future = concurrent.futures.Future()

        def add(engine: Any) -> None:
            if request.rid in self._pending:
                raise ValueError(f"rid={request.rid!r} is already running; use a unique request id")
            engine.add_request(request)
            self._pending[request.rid] = _Pending(result)

        added = self.call(add)

        def chain(f: concurrent.futures.Future) -> None:
            if f.exception() is not None:
                result.set_exception(f.exception())

        added.add_done_callback(chain)
        return result

    def abort_all(self) -> concurrent.futures.Future:
        """Abort every queued or running request (their results come back with finish type "abort")."""
        return self.call(lambda engine: sum(bool(engine.abort(rid)) for rid in list(self._pending)))

    def stop(self, timeout: float = 30.0) -> None:
        """Abort what runs, write the final snapshot, end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- engine thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        break
                    if not self._queue and not self.engine.has_unfinished():
                        self._cond.wait(self._wait_timeout())
                    commands = self._take_runnable()
                for cmd in commands:
                    self._execute(cmd)
                if self.engine.has_unfinished():
                    self._step()
                self._maybe_snapshot(force=False)
        finally:
            self._shutdown()

    def _wait_timeout(self) -> float:
        if self._dirty_since is None:
            return self._idle_wait_s * 20
        return max(0.0, self._dirty_since + self.snapshot_debounce_s - time.monotonic())

    def _take_runnable(self) -> list[_Command]:
        """Commands from the head of the queue up to (excluding) a barrier that cannot run yet."""
        out: list[_Command] = []
        while self._queue:
            cmd = self._queue[0]
            if cmd.barrier and (out or self.engine.has_unfinished()):
                break
            out.append(self._queue.popleft())
            if cmd.barrier:
                break
        return out

    def _execute(self, cmd: _Command) -> None:
        if not cmd.future.set_running_or_notify_cancel():
            return
        try:
            value = cmd.fn(self.engine)
        except BaseException as exc:  # handed to the waiting HTTP handler
            cmd.future.set_exception(exc)
        else:
            cmd.future.set_result(value)
        if cmd.changes_history and self.history is not None and self._dirty_since is None:
            self._dirty_since = time.monotonic()

    def _step(self) -> None:
        try:
            finished = self.engine.step()
        except Exception as exc:
            logger.exception("engine step failed; the server stops accepting requests")
            self._failed = f"engine step failed: {type(exc).__name__}: {exc}"
            for pending in self._pending.values():
                pending.future.set_exception(BackendUnavailable(self._failed))
            self._pending.clear()
            with self._cond:
                self._stopping = True
            return
        for result in finished:
            pending = self._pending.pop(result.rid, None)
            if pending is not None and not pending.future.done():
                pending.future.set_result(result)

    def _maybe_snapshot(self, force: bool) -> None:
        if self.history is None or self._dirty_since is None:
            return
        if not force and time.monotonic() < self._dirty_since + self.snapshot_debounce_s:
            return
        try:
            self.history.snapshot(self.engine.drafter)
        except Exception:  # the log still holds every acknowledged change; retried after the debounce
            logger.exception("history snapshot failed: %s", self.history.problem)
            self._dirty_since = time.monotonic()
            return
        self._dirty_since = None
        self.snapshots_written += 1

    def _shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            leftover = list(self._queue)
            self._queue.clear()
        for cmd in leftover:
            if not cmd.future.done():
                cmd.future.set_exception(BackendUnavailable("server is shutting down"))
        if self._failed is None:
            for rid in list(self._pending):
                try:
                    self.engine.abort(rid)
                except Exception:
                    logger.exception("abort of %s at shutdown failed", rid)
            deadline = time.monotonic() + 10.0
            while self._pending and self.engine.has_unfinished() and time.monotonic() < deadline:
                self._step()
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(BackendUnavailable("server is shutting down"))
        self._pending.clear()
        if self._dirty_since is None and self.history is not None:  # always write at the end
            self._dirty_since = time.monotonic()
        self._maybe_snapshot(force=True)
        if self.history is not None:
            self.history.close()
