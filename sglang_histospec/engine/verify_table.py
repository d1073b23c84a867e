"""Measuring a verify-cost table: the time of one verify pass against rows per request and batch size.

Each cell is the median of ``repeats`` synchronised passes (``engine/profile.py``'s ``verify_pass``: the forward
over ``batch x rows`` query rows after ``context`` cached keys, the logits and their softmax) after ``warmup``
untimed ones. A cell that would not fit in free memory, or in what is left of the time budget, is skipped with
its reason; a device out of memory is recorded and the next cell runs; a cell slower than one of more rows is
timed once more at the end. ``histospec bench verify-cost`` and
``scripts/gpu_check.py`` run it; ``measured_table`` turns the cells into the ``--verify-cost`` file format.

Example::

    fwd = TreeForward(model)
    cells = time_cells(fwd, VerifyTimingConfig(batches=[1, 8], rows=[1, 2, 4]), Deadline(60.0))
    table = measured_table(cells, "measured: tiny float32 on cpu", {"device": "cpu"})
    table.pass_ms(4, 8)                               # milliseconds of a pass of 8 requests x 4 rows
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_histospec.drafting.verify_cost import VerifyCostTable
from sglang_histospec.engine.model import KVCache, TreeForward
from sglang_histospec.engine.profile import verify_pass

BATCHES = (1, 8, 32, 128, 256)
ROWS = (1, 2, 4, 8, 16, 32)
MEMORY_HEADROOM = 0.9
"""A cell runs when its estimated bytes fit in this share of the free memory."""
GROWTH = 2.5
"""A cell is predicted to take at most this many times the previous cell's pass (rows double, or batch grows)."""
ORDER_SLACK = 1.1
"""A cell is out of order when its median exceeds this many times that of a cell of the same batch with more rows."""


@dataclass(slots=True)
class VerifyTimingConfig:
    """The grid and the timing of a verify-cost measurement."""

    batches: list[int] = field(default_factory=lambda: list(BATCHES))
    rows: list[int] = field(default_factory=lambda: list(ROWS))
    """Verify rows per request (the root plus the draft nodes)."""
    context: int = 512
    """Cached tokens every request attends to (prompt and response so far)."""
    repeats: int = 5
    """Timed passes per cell; the cell's figure is their median."""
    warmup: int = 1
    """Untimed passes before them."""

    def __post_init__(self) -> None:
        if not self.batches or not self.rows or min(self.batches + self.rows) < 1:
            raise ValueError(f"--batches {self.batches} --rows {self.rows}: give non-empty lists of ints >= 1")
        if self.context < 0 or self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"--context {self.context} --repeats {self.repeats} --warmup {self.warmup}: "
                "context needs >= 0, repeats >= 1, warmup >= 0"
            )
        self.batches, self.rows = sorted(set(self.batches)), sorted(set(self.rows))


class Deadline:
    """Seconds left of a time budget. Example: ``Deadline(60).left()`` is just under 60 right after."""

    def __init__(self, budget_s: float) -> None:
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


def free_bytes(device: str | torch.device) -> int:
    """Bytes this process could still allocate on ``device`` (the allocator's cached free blocks included)."""
    device = torch.device(device)
    if device.type == "cpu":
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cache_bytes(config, batch: int, tokens: int, elt: int) -> int:
    """The KV cache of ``batch`` requests of ``tokens`` tokens each, for a model ``config`` (Llama-style names)."""
    return config.num_hidden_layers * 2 * batch * config.num_key_value_heads * tokens * _head_dim(config) * elt


def pass_bytes(config, batch: int, rows: int, context: int, elt: int) -> int:
    """A generous estimate of a verify pass's temporaries: layer activations, the attention's expanded keys,
    scores and mask, and the logits (in ``elt``, as float32, and their softmax)."""
    r, t = batch * rows, context + rows
    layer = r * (6 * config.hidden_size + 3 * config.intermediate_size) * elt
    heads = config.num_attention_heads
    attention = batch * heads * (2 * t * _head_dim(config) * elt + rows * t * 8) + batch * rows * t * elt
    return layer + attention + r * config.vocab_size * (elt + 8)


def time_cells(
    fwd: TreeForward,
    cfg: VerifyTimingConfig,
    deadline: Deadline,
    on_cell: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Every (batch, rows) cell of ``cfg`` as ``{"batch", "rows", "status", ...}`` (``ok`` cells carry
    ``median_ms`` and ``times_ms``, and ``peak_gib`` on CUDA; others a ``reason``); ``on_cell(cells)`` after each."""
    cells: list[dict] = []
    last = [0.0]  # the previous measured pass, seconds
    for batch in cfg.batches:
        _time_batch(fwd, cfg, batch, deadline, cells, last, on_cell or (lambda _: None))
    _retime_out_of_order(fwd, cfg, cells, deadline, on_cell or (lambda _: None))
    return cells


def out_of_order(cells: list[dict]) -> list[int]:
    """Indices of ``ok`` cells slower (by more than ``ORDER_SLACK``) than a cell of the same batch with more rows:
    a pass never gets cheaper with more rows, so such a median was disturbed (another process, a clock change).
    Example: at batch 4, rows 1, 2, 4 timed 9.0, 2.0, 3.0 ms give ``[0]``."""
    out = []
    for i, c in enumerate(cells):
        if c["status"] == "ok" and any(
            d["status"] == "ok"
            and d["batch"] == c["batch"]
            and d["rows"] > c["rows"]
            and ORDER_SLACK * d["median_ms"] < c["median_ms"]
            for d in cells
        ):
            out.append(i)
    return out


def _retime_out_of_order(fwd, cfg, cells, deadline, on_cell) -> None:
    """Each out-of-order cell timed once more (while the budget lasts); its median is then over both rounds'
    passes (``retimed``: true)."""
    for i in out_of_order(cells):
        c = cells[i]
        if (cfg.warmup + cfg.repeats) * c["median_ms"] / 1e3 > deadline.left():
            continue
        cache = _random_cache(fwd, c["batch"], cfg.context + max(cfg.rows))
        times = c["times_ms"] + [round(1e3 * t, 4) for t in timed_passes(fwd, cache, c["batch"], c["rows"], cfg)]
        cells[i] = {**c, "median_ms": round(statistics.median(times), 4), "times_ms": times, "retimed": True}
        on_cell(cells)


def _time_batch(fwd, cfg, batch, deadline, cells, last, on_cell) -> None:
    """The cells of one batch size over one KV cache (random contents) of ``batch`` x (context + max rows)."""
    elt, config = fwd.dtype.itemsize, fwd.model.config
    tokens = cfg.context + max(cfg.rows)
    need, free = cache_bytes(config, batch, tokens, elt), free_bytes(fwd.device)
    if need > MEMORY_HEADROOM * free:
        reason = f"KV cache {need / 2**30:.1f} GiB > {MEMORY_HEADROOM} x free {free / 2**30:.1f}"
        cells += [_skipped(batch, rows, reason) for rows in cfg.rows]
        on_cell(cells)
        return
    cache = _random_cache(fwd, batch, tokens)
    for rows in cfg.rows:
        cells.append(_time_cell(fwd, cfg, cache, batch, rows, deadline, last))
        on_cell(cells)
    del cache


def _random_cache(fwd: TreeForward, batch: int, tokens: int) -> KVCache:
    """A KV cache of ``batch`` x ``tokens`` slots of random contents, as every cell is timed over."""
    cache = fwd.new_cache(batch, tokens)
    cache.ensure(batch, tokens)
    cache.data.normal_()
    return cache


def _skipped(batch: int, rows: int, reason: str) -> dict:
    return {"batch": batch, "rows": rows, "status": "skipped", "reason": reason}


def _time_cell(fwd, cfg, cache, batch, rows, deadline, last) -> dict:
    """Median milliseconds of ``cfg.repeats`` verify passes of ``batch`` requests x ``rows`` rows."""
    need, free = pass_bytes(fwd.model.config, batch, rows, cfg.context, fwd.dtype.itemsize), free_bytes(fwd.device)
    if need > MEMORY_HEADROOM * free:
        return _skipped(batch, rows, f"pass ~{need / 2**30:.1f} GiB > {MEMORY_HEADROOM} x free {free / 2**30:.1f}")
    predicted = (cfg.warmup + cfg.repeats) * last[0] * GROWTH
    if predicted > deadline.left():
        return _skipped(batch, rows, f"time budget: ~{predicted:.1f} s needed, {max(0, deadline.left()):.1f} s left")
    cuda = fwd.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(fwd.device)
    times, oom = [], None
    try:
        times = timed_passes(fwd, cache, batch, rows, cfg)
    except torch.OutOfMemoryError as exc:
        oom = f"out of memory: {str(exc)[:160]}"
    if oom:  # freed here, where the exception's frames no longer hold the pass's tensors
        if cuda:
            torch.cuda.empty_cache()
        return {**_skipped(batch, rows, oom), "status": "oom"}
    last[0] = statistics.median(times)
    cell = {"batch": batch, "rows": rows, "status": "ok", "median_ms": round(1e3 * last[0], 4),
            "times_ms": [round(1e3 * t, 4) for t in times]}  # fmt: skip
    if cuda:
        cell["peak_gib"] = round(torch.cuda.max_memory_allocated(fwd.device) / 2**30, 2)
    return cell


def timed_passes(fwd: TreeForward, cache: KVCache, batch: int, rows: int, cfg: VerifyTimingConfig) -> list[float]:
    """Seconds of each of ``cfg.repeats`` synchronised passes, after ``cfg.warmup`` untimed ones."""
    for _ in range(cfg.warmup):
        verify_pass(fwd, cache, batch, rows - 1, context=cfg.context)
    times = []
    for _ in range(cfg.repeats):
        _sync(fwd.device)
        started = time.perf_counter()
        verify_pass(fwd, cache, batch, rows - 1, context=cfg.context)
        _sync(fwd.device)
        times.append(time.perf_counter() - started)
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_table(cells: list[dict], label: str, meta: dict) -> VerifyCostTable:
    """The ``ok`` cells as a table of absolute pass times (``meta["measured"]`` set, the cells kept in
    ``meta["cells"]``). A row's times are made non-decreasing in rows (each the largest measured at or below it:
    noise can time more rows faster; the raw medians stay in the cells). Example: cells of batch 1 at 1 and 2 rows
    timed 2.0 and 1.9 ms give ``ms = {1: ([1, 2], [2.0, 2.0])}``."""
    by_batch: dict[int, dict[int, float]] = {}
    for c in cells:
        if c["status"] == "ok":
            by_batch.setdefault(c["batch"], {})[c["rows"]] = c["median_ms"]
    if not by_batch:
        reasons = sorted({c.get("reason", c["status"]) for c in cells})
        raise ValueError(f"no cell was measured ({'; '.join(reasons)[:300]}); give a larger --time-budget-s")
    ms = {}
    for batch, points in sorted(by_batch.items()):
        ks = sorted(points)
        ms[batch] = (ks, _running_max([points[k] for k in ks]))
    return VerifyCostTable.from_ms(ms, label, {**meta, "measured": True, "cells": cells})


def save_table(path: str | os.PathLike, cells: list[dict], meta: dict) -> VerifyCostTable:
    """``measured_table`` of ``cells``, labelled from ``meta`` (model, dtype, device, context, date), written to
    ``path`` as the ``--verify-cost`` file (whole: through a temporary file beside it)."""
    label = (
        f"measured: {meta['model']}, {meta['dtype']} on {meta['device']}, context {meta['context']} ({meta['date']})"
    )
    table = measured_table(cells, label, meta)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(table.to_dict(), f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return table


def _running_max(values: list[float]) -> list[float]:
    out, top = [], 0.0
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


__all__ = [
    "BATCHES",
    "ROWS",
    "Deadline",
    "VerifyTimingConfig",
    "cache_bytes",
    "free_bytes",
    "measured_table",
    "out_of_order",
    "pass_bytes",
    "save_table",
    "time_cells",
    "timed_passes",
]
