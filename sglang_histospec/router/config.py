"""The router's config, its error and its step answer (no HTTP, no threads): :class:`RouterConfig`,
:class:`RouterError`, :class:`StepAnswers`.

Example: ``RouterConfig(backends=["http://127.0.0.1:30001"], overlap=True)``; ``RouterConfig(backends=[])`` raises
ValueError naming the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from sglang_histospec.pipe.planner import POLICIES, PlannerConfig
from sglang_histospec.router.recovery import REPLAY_MAX_BYTES, REPLAY_STEPS
from sglang_histospec.server.http_api import ApiError, check_admin_key
from sglang_histospec.server.schemas import RequestLimits

SHUTDOWN_POLL_S = 0.1
"""Seconds between two checks, while a call waits for its backends, of whether the router is shutting down."""

BACKEND_COUNTERS = (
    "requests",
    "completion_tokens",
    "failures",
    "failed_requests",
    "resubmitted_in",
    "migrated_out",
    "migrated_in",
    "deferred",
)
"""Per-backend counters in ``/metrics`` (``histopipe_backend_<name>_total``)."""


class RouterError(ApiError):
    """A request the router cannot serve: ``status`` is the HTTP status to answer with (shared error format)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(status, message, field)


@dataclass(slots=True)
class RouterConfig:
    backends: list[str]
    """Base URLs of the rollout servers (``histospec serve``)."""
    policy: str = "histopipe"
    """Placement policy of a step: one of ``POLICIES``."""
    admin_api_key: str | None = None
    """Sent to the backends' admin routes; when set the router's own admin routes require it too."""
    health_interval_s: float = 2.0
    """Seconds between health checks of every backend."""
    request_timeout_s: float = 600.0
    """A backend call taking longer counts as a failure (its requests are resubmitted)."""
    max_attempts: int = 3
    """A request is tried on at most this many backends."""
    migrate_outliers: bool = True
    """Abort running outliers and resume them on an idle backend (one /generate call per request); False =
    one batched call per backend, no migration."""
    outlier_check_s: float = 0.05
    """Seconds between two outlier scans of a step's running requests."""
    max_inflight: int = 256
    """With migration: at most this many /generate calls in flight at once (the rest wait in the router)."""
    planner: PlannerConfig | None = None
    """Outlier rule (``outlier_factor``, ``tail_fraction``, with overlap ``max_deferrals``; the step factor of
    deferral is ``DEFER_STEP_FACTOR["router"]``) and planner settings; None = defaults with ``policy``."""
    overlap: bool = False
    """One-step overlap, opt-in (its data is one step off-policy): a step (:meth:`Router.overlap_step`,
    ``POST /histopipe/step``) returns once the requests the deferral rule does not defer are answered; deferred
    ones keep running and are answered with the next step call or :meth:`Router.drain` (``POST
    /histopipe/drain``). Outliers are deferred, not migrated. Needs ``migrate_outliers`` (one call per request).
    False = synchronous steps (:meth:`Router.run_step`)."""

    limits: RequestLimits = field(default_factory=RequestLimits)
    """The same client limits as a server's (checked before anything is forwarded)."""
    max_request_bytes: int = 64 * 2**20
    """Larger request bodies get HTTP 413."""
    trace_path: str | None = None
    """Append every answer to this trace (``.jsonl`` or ``.jsonl.gz``; ``router/trace_log.py``), one write per call,
    for ``histospec replay``; an existing file keeps its steps below the first step appended."""
    replay_steps: int = REPLAY_STEPS
    """History pushes of this many newest steps (current and previous) are kept and replayed to a backend that
    comes back or is added, before requests are routed to it (``router/recovery.py``)."""
    replay_max_bytes: int = REPLAY_MAX_BYTES
    """Bound on the kept pushes; the oldest go first (``/health`` then lists their steps as incomplete)."""

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("RouterConfig.backends is empty: give at least one rollout server URL")
        if self.policy not in POLICIES:
            raise ValueError(f"RouterConfig.policy={self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.replay_steps < 1 or self.replay_max_bytes < 1:
            raise ValueError(
                f"RouterConfig.replay_steps={self.replay_steps!r}, replay_max_bytes={self.replay_max_bytes!r}: "
                "both must be >= 1"
            )
        if self.max_attempts < 1:
            raise ValueError(f"RouterConfig.max_attempts={self.max_attempts!r}: must be >= 1")
        check_admin_key(self.admin_api_key)
        if self.trace_path is not None and (not self.trace_path or os.path.isdir(self.trace_path)):
            raise ValueError(
                f"RouterConfig.trace_path={self.trace_path!r}: give a file path, e.g. 'rollouts.jsonl.gz'"
            )
        if not self.outlier_check_s > 0:
            raise ValueError(f"RouterConfig.outlier_check_s={self.outlier_check_s!r}: must be > 0 seconds")
        if not (isinstance(self.max_inflight, int) and self.max_inflight >= 1):
            raise ValueError(f"RouterConfig.max_inflight={self.max_inflight!r}: must be an int >= 1")
        if self.overlap and not self.migrate_outliers:
            raise ValueError("RouterConfig.overlap needs migrate_outliers=True (one /generate call per request)")
        if self.planner is not None and self.planner.policy != self.policy:
            raise ValueError(
                f"RouterConfig.planner.policy={self.planner.policy!r} differs from policy={self.policy!r}: set one"
            )


@dataclass(slots=True)
class StepAnswers:
    """The answer of a step call with one-step overlap (:meth:`Router.overlap_step`, ``POST /histopipe/step``)."""

    step: int
    results: list[dict[str, Any] | None]
    """This step's answers in request order (prompt i, sample j at i * G + j); None where deferred."""
    deferred: list[int]
    """Indices in ``results`` of the requests still running: they are answered with a later call (``carried``)."""
    carried: list[dict[str, Any]]
    """Answers of earlier steps' deferred requests that finished by now: ``meta_info.histopipe.step`` and
    ``.index`` say which request of which step, ``.weight_version`` the weight version when it was sent."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "results": self.results, "deferred": self.deferred, "carried": self.carried}
