"""``histospec trace record --out TRACE``: GRPO on a chat model through the embedded engine, recorded as a trace.

Example: ``histospec trace record --model smollm2-135m-instruct --family arith --epochs 8 --out arith.jsonl.gz``.
Resumable: rerun the same command after an interruption (finished epochs are kept in ``--work-dir``). Every
``RecordConfig`` field is a flag (``sglang_histospec/trace/record.py``); one JSON line per epoch is printed as it ends.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

COMMAND = ("trace", "record")
HELP = "record a real GRPO trace (chat task families, SmolLM2 or any Llama/Qwen directory) with the embedded engine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.commands._flags import add_config_flags
    from sglang_histospec.trace.record import RecordConfig

    parser.add_argument("--out", required=True, help="trace path (.jsonl or .jsonl.gz)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model name or directory")
    parser.add_argument("--work-dir", default=None, help="per-epoch shards and checkpoints (default OUT.work)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="print a summary JSON object on the last stdout line")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_config_flags(parser, RecordConfig)


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.commands._flags import config_from_flags
    from sglang_histospec.models import resolve_model
    from sglang_histospec.trace.record import RecordConfig, record_trace

    try:
        cfg = config_from_flags(RecordConfig, args)
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        model_dir = resolve_model(args.model, progress=not args.no_progress)
        epochs = record_trace(model_dir, cfg, args.out, args.work_dir or args.out + ".work", not args.no_progress)
    except (ValueError, OSError) as e:
        print(f"histospec trace record: {e}", file=sys.stderr)
        return 2
    summary = {"out": args.out, "model": args.model, "config": asdict(cfg), "epochs": [asdict(e) for e in epochs]}
    print(json.dumps(summary) if args.json else f"wrote {len(epochs)} epochs to {args.out}")
    return 0
