"""Rollout traces: the on-disk format, synthetic traces and trace statistics; the recorder of real GRPO traces
(``trace/record.py``) and the seeded requests of an epoch (``trace/seeding.py``) are imported from their modules."""

from sglang_histospec.trace.format import (
    TraceError,
    TraceRecord,
    TraceStep,
    TraceWriter,
    iter_steps,
    load_steps,
    read_trace,
    write_trace,
)
from sglang_histospec.trace.stats import TraceStats, trace_stats
from sglang_histospec.trace.synth import SynthConfig, write_synthetic

__all__ = [
    "SynthConfig",
    "TraceError",
    "TraceRecord",
    "TraceStats",
    "TraceStep",
    "TraceWriter",
    "iter_steps",
    "load_steps",
    "read_trace",
    "trace_stats",
    "write_synthetic",
    "write_trace",
]
