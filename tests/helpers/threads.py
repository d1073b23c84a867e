"""Run a worker on several Python threads at once and surface what any of them raised."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_threads(worker: Callable[[int], None], n: int, timeout_s: float = 120.0) -> None:
    """Start ``worker(0) .. worker(n - 1)`` together and join them; fails when one raised or is still alive (a
    deadlock).

    Example: ``run_threads(lambda w: idx.draft_batch([f"r{w}"], [8]), 4)``.
    """
    errors: list[BaseException] = []

    def guarded(w: int) -> None:
        try:
            worker(w)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a thread is still running (deadlock?)"
