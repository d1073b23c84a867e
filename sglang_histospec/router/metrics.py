"""What the router reports (pure: no HTTP): the servers' ``/histospec/stats`` summed (:func:`sum_stats`) and the
Prometheus text of ``/metrics`` (:func:`metrics_text`).

Example: ``sum_stats({"a": {"generated_tokens": 6, "verify_steps": 3}, "b": {"generated_tokens": 2,
"verify_steps": 1}})`` -> ``{"generated_tokens": 8, "verify_steps": 4, "tau": 2.0, "history": {}}``.
"""

from __future__ import annotations

from typing import Any

from sglang_histospec.drafting.types import tau
from sglang_histospec.router.backends import Backend
from sglang_histospec.router.config import BACKEND_COUNTERS


def _add_numbers(total: dict[str, Any], values: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    for k, v in values.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in skip:
            total[k] = total.get(k, 0) + v


def sum_stats(per_backend: dict[str, Any]) -> dict[str, Any]:
    """The servers' stats summed (numbers only; ``tau`` recomputed from the sums), with ``history`` summed too."""
    total: dict[str, Any] = {}
    history: dict[str, Any] = {}
    for st in per_backend.values():
        _add_numbers(total, st, skip=("tau",))
        _add_numbers(history, st.get("history") or {})
    if "generated_tokens" in total:
        total["tau"] = tau(total["generated_tokens"], total.get("verify_steps", 0))
    return {**total, "history": history}


def metrics_text(backends: list[Backend], totals: dict[str, int]) -> str:
    """Prometheus text: per backend its health and :data:`BACKEND_COUNTERS`, then the router's ``totals``
    (``steps``, ``migrations``, ``deferred`` counters and the ``carried`` gauge)."""
    lines = [
        "# TYPE histopipe_backend_healthy gauge",
        *(f'histopipe_backend_healthy{{backend="{b.url}"}} {int(b.healthy)}' for b in backends),
    ]
    for name in BACKEND_COUNTERS:
        lines.append(f"# TYPE histopipe_backend_{name}_total counter")
        lines += [f'histopipe_backend_{name}_total{{backend="{b.url}"}} {b.counters.get(name, 0)}' for b in backends]
    for name in ("steps", "migrations", "deferred"):
        lines += [f"# TYPE histopipe_{name}_total counter", f"histopipe_{name}_total {totals[name]}"]
    lines += ["# TYPE histopipe_carried_requests gauge", f"histopipe_carried_requests {totals['carried']}"]
    return "\n".join(lines) + "\n"
