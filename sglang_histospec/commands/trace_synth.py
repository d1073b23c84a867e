"""``histospec trace synth OUT``: write a synthetic trace (controllable drift, long-tailed lengths).

Example: ``histospec trace synth synth.jsonl.gz --prompts 200 --group-size 8 --epochs 3 --drift 0.1 --json``.
Every ``SynthConfig`` field is a flag (``sglang_histospec/trace/synth.py``). Synthetic traces serve tests and
benchmarks of the tooling; figures about real behaviour come from traces of real runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

COMMAND = ("trace", "synth")
HELP = "write a synthetic rollout trace with controllable drift between epochs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.commands._flags import add_config_flags
    from sglang_histospec.trace.synth import SynthConfig

    parser.add_argument("out", help="output path (.jsonl or .jsonl.gz)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")
    add_config_flags(parser, SynthConfig)


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.commands._flags import config_from_flags
    from sglang_histospec.trace.synth import SynthConfig, write_synthetic

    try:
        cfg = config_from_flags(SynthConfig, args)
        n = write_synthetic(args.out, cfg)
    except (ValueError, OSError) as e:
        print(f"histospec trace synth: {e}", file=sys.stderr)
        return 2
    out = {"out": args.out, "records": n, "steps": cfg.epochs * cfg.steps_per_epoch, "config": {
        f.name: getattr(cfg, f.name) for f in fields(SynthConfig)}}  # fmt: skip
    print(json.dumps(out) if args.json else f"wrote {n} records to {args.out}")
    return 0
