"""``histospec bench verify-cost``: a measured verify-cost table for ``histospec replay --verify-cost FILE``.

Times one verify pass (the forward over ``batch x rows`` query rows after ``--context`` cached keys, the logits,
their softmax) at every batch size and rows per request, for a model directory or a named shape of random weights
(``models/shapes.py``: the cost of the real model, meaningless tokens), bfloat16 on CUDA and float32 on CPU by
default. ``--out`` is rewritten after every cell, so a run cut off keeps what it measured. Format: docs/replay.md
section 5.

Example::

    histospec bench verify-cost --device cuda --shape 8b --out h100_8b.json
    histospec bench verify-cost --device cpu --model smollm2-135m-instruct --batches 1,4,16 --out cpu.json
"""

from __future__ import annotations

import argparse

from sglang_histospec.engine.verify_table import BATCHES, ROWS, VerifyTimingConfig

COMMAND = ("bench", "verify-cost")
HELP = "Time a verify pass against rows per request and batch size; write the --verify-cost table (ms per pass)."


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of ints, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = VerifyTimingConfig()
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model directory, or a name histospec model prepare knows")
    which.add_argument("--shape", help="a named shape with random weights: tiny, 0.5b, 1.5b, 8b")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), float32, ...")
    parser.add_argument("--out", required=True, help="the table file written (JSON)")
    parser.add_argument("--batches", type=_ints, default=list(BATCHES), help="batch sizes, e.g. 1,8,32,128,256")
    parser.add_argument("--rows", type=_ints, default=list(ROWS), help="rows per request (root + drafts)")
    parser.add_argument("--context", type=int, default=defaults.context, help="cached tokens per request")
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="timed passes per cell (median)")
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed passes per cell first")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--time-budget-s", type=float, default=600.0, help="cells that would end later are skipped")
    parser.add_argument("--json", action="store_true", help="print one JSON summary on the last stdout line")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from sglang_histospec.engine.verify_table import Deadline

    try:
        cfg = VerifyTimingConfig(args.batches, args.rows, args.context, args.repeats, args.warmup)
        fwd, meta = _load(args)
    except ValueError as e:
        raise SystemExit(f"histospec bench verify-cost: {e}") from e
    meta.update(context=cfg.context, repeats=cfg.repeats, warmup=cfg.warmup)
    writer = _Writer(args.out, meta, lambda msg: print(f"[bench verify-cost] {msg}", file=sys.stderr, flush=True))
    from sglang_histospec.engine.verify_table import time_cells

    cells = time_cells(fwd, cfg, Deadline(args.time_budget_s), on_cell=writer)
    try:
        table = writer.write(cells)
    except ValueError as e:
        raise SystemExit(f"histospec bench verify-cost: {e}") from e
    summary = {"out": args.out, "label": table.label, "measured_cells": sum(c["status"] == "ok" for c in cells),
               "skipped_cells": sum(c["status"] != "ok" for c in cells), "ms": table.to_dict()["ms"]}  # fmt: skip
    print(json.dumps(summary) if args.json else _text(table))
    return 0


def _load(args: argparse.Namespace):
    """The ``TreeForward`` of ``--model`` or ``--shape`` on ``--device``, and the table's ``meta``."""
    import torch

    from sglang_histospec.engine.engine import resolve_device, resolve_dtype
    from sglang_histospec.engine.model import TreeForward, check_architecture

    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ValueError(f"--device {args.device!r}; use cpu, cuda or cuda:N")
    if args.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype {args.dtype!r}; use auto, float32, bfloat16 or float16")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads}; use 1 or more")
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    dtype_name = str(dtype).removeprefix("torch.")
    if args.shape is not None:
        from sglang_histospec.models.shapes import random_model

        model, what = random_model(args.shape, device=str(device), dtype=dtype_name), f"shape {args.shape}"
    else:
        model, what = _pretrained(args.model, device, dtype), f"model {args.model}"
    check_architecture(model.config)
    meta = {"model": what, "parameters": sum(p.numel() for p in model.parameters()), "dtype": dtype_name,
            **_machine(device)}  # fmt: skip
    return TreeForward(model), meta


def _pretrained(name: str, device, dtype):
    import os

    from transformers import AutoModelForCausalLM

    from sglang_histospec.models import resolve_model

    path = name if os.path.isdir(name) else resolve_model(name, progress=False)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def _machine(device) -> dict:
    """Where and when the table was measured: device, threads, load, torch, commit, date."""
    import os
    import platform
    import subprocess
    import time

    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"
    here = os.path.dirname(os.path.abspath(__file__))
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
    return {"device": name, "torch": torch.__version__, "commit": git.stdout.strip() or None,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}  # fmt: skip


class _Writer:
    """``--out`` rewritten as a table after every cell (once at least one is measured), with progress."""

    def __init__(self, path: str, meta: dict, progress) -> None:
        self.path, self.meta, self.progress, self.seen = path, meta, progress, 0

    def __call__(self, cells: list[dict]) -> None:
        c = cells[-1]
        if len(cells) == self.seen:
            self.progress("timed once more: a cell slower than one with more rows")
        elif c["status"] == "ok":
            self.progress(f"batch {c['batch']} rows {c['rows']}: {c['median_ms']:.3f} ms")
        else:
            self.progress(f"batch {c['batch']} rows {c['rows']}: {c['status']} ({c['reason']})")
        self.seen = len(cells)
        if any(c["status"] == "ok" for c in cells):
            self.write(cells)

    def write(self, cells: list[dict]):
        from sglang_histospec.engine.verify_table import save_table

        return save_table(self.path, cells, self.meta)


def _text(table) -> str:
    """The table as text: ms per pass, one line per batch size."""
    lines = [table.label, "ms per pass (rows per request ->)"]
    for batch, (ks, vs) in sorted(table.ms.items()):
        lines.append(f"batch {batch:4d}  " + "  ".join(f"{k}:{v:.2f}" for k, v in zip(ks, vs)))
    return "\n".join(lines)
