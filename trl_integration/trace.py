"""The trainer's own rollouts as a trace (``HistoSpecGRPOConfig.trace_path``): :class:`RolloutTrace` appends each
training generation as one step of the trace format, so ``histospec replay`` can replay the run.

Example::

    trace = RolloutTrace("out/trace.jsonl.gz")
    trace.append(step=3, epoch=1, gathered=[("q0", [1, 5], [7, 2], [-0.1, -0.3])], rewards=[1.0])
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from sglang_histospec.drafting.prompt_ids import token_prompt_id
from sglang_histospec.trace.append import TraceAppender
from sglang_histospec.trace.format import TraceRecord


class RolloutTrace:
    """One :class:`TraceAppender` per run (main process); what a crash leaves: ``trace/append.py``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.appender = TraceAppender(path)

    def append(self, step: int, epoch: int, gathered: Sequence[tuple[Any, ...]], rewards: Sequence[float]) -> int:
        """Append one generation: ``gathered`` = (prompt id or None, prompt ids, completion ids, logprobs or None)
        per sample, ``rewards`` one per sample (NaN: unknown); samples are numbered per prompt in this order."""
        records = [
            TraceRecord(
                step=step,
                prompt_id=pid or token_prompt_id(list(prompt)),
                sample=0,
                prompt=list(prompt),
                response=list(response),
                epoch=epoch,
                reward=float(reward) if math.isfinite(reward) else None,
                logprobs=_logprobs(logprobs, len(response)),
            )
            for (pid, prompt, response, logprobs), reward in zip(gathered, rewards)
        ]
        return self.appender.append(records, number_samples=True)


def _logprobs(values: Sequence[float] | None, n: int) -> list[float] | None:
    """The sampling logprobs when there is one finite value <= 0 per token, else None (the field is optional)."""
    if values is None or len(values) != n:
        return None
    out = [float(v) for v in values]
    return out if all(math.isfinite(v) and v <= 0.0 for v in out) else None
