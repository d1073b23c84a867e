"""The router's answers as a trace (``RouterConfig.trace_path``, ``histospec route --trace-path``):
:class:`RouterTrace` appends each call's answers (a step call, a drain, a plain ``/generate``) in one write, so
``histospec replay`` can replay the run. What a crash leaves: ``trace/append.py``.

Example::

    trace = RouterTrace("rollouts.jsonl.gz")
    trace.append([(3, {"input_ids": [1, 5], "sampling_params": {"custom_params": {"prompt_id": "q0"}}},
                   {"output_ids": [7, 2], "meta_info": {}})])      # step 3, prompt q0, sample 0
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from sglang_histospec.router.items import item_prompt_id
from sglang_histospec.trace.append import TraceAppender
from sglang_histospec.trace.format import TraceRecord

log = logging.getLogger(__name__)


class RouterTrace:
    """Answers -> trace records: ``input_ids`` items only (a ``text`` item has no tokens here, the router has no
    tokenizer), no rewards (the router never sees them), logprobs when the client asked for them."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.appender = TraceAppender(path)
        self.errors = 0
        """Appends that failed (logged; the answers still went out)."""
        self._lock = threading.Lock()

    def append(self, answers: Iterable[tuple[int, dict[str, Any], dict[str, Any] | None]]) -> int:
        """Append (step, item, answer) triples in one write; returns the records written. A write error is
        logged and counted, never raised: a full disk must not fail the rollout."""
        records = [r for step, item, out in answers if out is not None and (r := _record(step, item, out))]
        if not records:
            return 0
        with self._lock:
            try:
                return self.appender.append(records, number_samples=True)
            except (OSError, ValueError):
                self.errors += 1
                log.exception("trace %s: could not append %d records", self.appender.path, len(records))
                return 0

    def close(self) -> None:
        with self._lock:
            self.appender.close()


def plain_step(weight_version: str | None, steps: int) -> int:
    """The step of a plain ``/generate`` answer: the weight version when it is a step number (what
    ``HistoSpecGRPOTrainer`` sends), else the router's count of step calls."""
    return int(weight_version) if weight_version is not None and weight_version.isdecimal() else steps


def _record(step: int, item: dict[str, Any], out: dict[str, Any]) -> TraceRecord | None:
    ids, pid = item.get("input_ids"), item_prompt_id(item)
    if not ids or pid is None or not isinstance(ids[0], int):
        return None
    response = list(out.get("output_ids") or [])
    return TraceRecord(max(0, step), pid, 0, list(ids), response, logprobs=_logprobs(out, len(response)))


def _logprobs(out: dict[str, Any], n: int) -> list[float] | None:
    """``meta_info.output_token_logprobs`` ([logprob, token, text] per token) as floats, when whole and valid."""
    rows = (out.get("meta_info") or {}).get("output_token_logprobs")
    if not isinstance(rows, list) or len(rows) != n:
        return None
    values = [row[0] if isinstance(row, (list, tuple)) and row else row for row in rows]
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0.0 for v in values)
    return [float(v) for v in values] if ok else None
