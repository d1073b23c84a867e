"""Server counters (backend-agnostic, fed from finished requests) and their Prometheus text exposition.

The vocabulary (verify step, drafted, accepted, tau) is defined once, in :class:`ServerCounters`. Example::

    c = ServerCounters()
    c.observe(prompt_tokens=3, completion_tokens=8, verify_steps=4, drafted=10, accepted=4, finish_type="length")
    c.tau()   # 2.0
    text = prometheus_text(c, {"history_tokens": 120, "memory_bytes": 4096, "prompts": 2})
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields
from typing import Any

from sglang_histospec.drafting.types import tau as tokens_per_step


@dataclass(slots=True)
class ServerCounters:
    """Monotonic counters since the server started.

    Vocabulary, defined once: a *verify step* is one target-model forward pass that a request takes part in after its
    prefill; *drafted* tokens are draft-tree nodes proposed (root excluded); *accepted* tokens are drafted tokens the
    verifier kept (bonus tokens excluded); ``tau = generated tokens / verify steps`` is the mean number of tokens a
    request gains per verify step (1.0 without drafting). Token counts of requests without drafting count too.
    """

    requests: int = 0
    """Finished /generate items (one per prompt of a batch), aborted ones included."""
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    bad_requests: int = 0
    """Requests answered with a 4xx."""
    client_disconnects: int = 0
    """/generate calls whose client went away before the answer (their requests were aborted)."""
    history_pushes: int = 0
    history_responses_pushed: int = 0
    """Responses pushed that were new to the history (a repeated prompt+step push counts as replaced)."""
    history_responses_replaced: int = 0
    """Responses pushed for a prompt+step the history already held (they replaced the earlier push)."""
    weight_updates: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        verify_steps: int,
        drafted: int,
        accepted: int,
        finish_type: str,
    ) -> None:
        with self._lock:
            self.requests += 1
            self.requests_aborted += finish_type == "abort"
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += completion_tokens
            self.verify_steps += verify_steps
            self.drafted_tokens += drafted
            self.accepted_tokens += accepted

    def add(self, name: str, value: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + value)

    def observe_push(self, stored: int, replaced: int) -> None:
        """One applied history push: ``stored`` responses, of which ``replaced`` replaced a prompt+step."""
        with self._lock:
            self.history_pushes += 1
            self.history_responses_pushed += stored - replaced
            self.history_responses_replaced += replaced

    def tau(self) -> float:
        """Tokens per verify step (:func:`~sglang_histospec.drafting.types.tau`: 0.0 before any verify step)."""
        return tokens_per_step(self.generated_tokens, self.verify_steps)

    def accept_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            out = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        out["tau"] = self.tau()
        out["accept_rate"] = self.accept_rate()
        return out


@dataclass(slots=True)
class HistoryCounters:
    """The history routes' counters alone, for a host that counts its other routes itself (SGLang's server)."""

    history_pushes: int = 0
    history_responses_pushed: int = 0
    """Responses stored by pushes (SGLang's workers do not tell replaced ones apart)."""

    def observe_push(self, stored: int, replaced: int) -> None:
        self.history_pushes += 1
        self.history_responses_pushed += stored - replaced

    def as_dict(self) -> dict[str, Any]:
        return {"history_pushes": self.history_pushes, "history_responses_pushed": self.history_responses_pushed}


# (name, type, help, key in ServerCounters.as_dict())
_COUNTER_METRICS = (
    ("histospec_requests_total", "counter", "Finished generation requests (batch items), aborted included.", "requests"),
    ("histospec_requests_aborted_total", "counter", "Aborted generation requests.", "requests_aborted"),
    ("histospec_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", "prompt_tokens"),
    ("histospec_generated_tokens_total", "counter", "Generated tokens of finished requests.", "generated_tokens"),
    ("histospec_verify_steps_total", "counter", "Verify steps (forward passes after prefill) per request, summed.",
     "verify_steps"),
    ("histospec_draft_tokens_total", "counter", "Draft tokens proposed.", "drafted_tokens"),
    ("histospec_accepted_tokens_total", "counter", "Draft tokens accepted (bonus tokens excluded).",
     "accepted_tokens"),
    ("histospec_bad_requests_total", "counter", "Requests answered with a 4xx status.", "bad_requests"),
    ("histospec_client_disconnects_total", "counter", "Generate calls abandoned by their client (aborted).",
     "client_disconnects"),
    ("histospec_history_pushes_total", "counter", "POST /histospec/history calls applied.", "history_pushes"),
    ("histospec_history_responses_pushed_total", "counter", "Responses added by history pushes (new prompt+step).",
     "history_responses_pushed"),
    ("histospec_history_responses_replaced_total", "counter",
     "Responses of pushes that replaced a prompt+step already held.", "history_responses_replaced"),
    ("histospec_weight_updates_total", "counter", "Successful weight updates.", "weight_updates"),
    ("histospec_tau", "gauge", "Generated tokens per verify step since start (1 = no speedup).", "tau"),
    ("histospec_accept_rate", "gauge", "Accepted / drafted tokens since start.", "accept_rate"),
)  # fmt: skip

# (name, help, key in the drafter's stats())
_HISTORY_METRICS = (
    ("histospec_history_tokens", "Tokens held in the history index.", "history_tokens"),
    ("histospec_history_bytes", "Memory of the history index in bytes.", "memory_bytes"),
    ("histospec_history_prompts", "Prompt ids with history.", "prompts"),
)


def _fmt(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def prometheus_text(
    counters: ServerCounters, history: dict[str, Any] | None, extra: dict[str, float] | None = None
) -> str:
    """Prometheus text exposition (format 0.0.4) of the counters, the drafter's stats and ``extra`` gauges."""
    lines: list[str] = []
    values = counters.as_dict()
    for name, kind, help_text, key in _COUNTER_METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_fmt(values[key])}"]
    for name, help_text, key in _HISTORY_METRICS:
        value = (history or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {_fmt(value)}"]
    for name, value in sorted((extra or {}).items()):
        lines += [f"# TYPE {name} gauge", f"{name} {_fmt(value)}"]
    return "\n".join(lines) + "\n"
