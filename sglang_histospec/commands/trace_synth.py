"""``histospec trace synth OUT``: write a synthetic trace (controllable drift, long-tailed lengths).

Example: ``histospec trace synth synth.jsonl.gz --prompts 200 --group-size 8 --epochs 3 --drift 0.1 --json``.
Every ``SynthConfig`` field is a flag (``sglang_histospec/core/synth.py``). Synthetic traces serve tests and
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
    from sglang_histospec.core.synth import SynthConfig

    parser.add_argument("out", help="output path (.jsonl or .jsonl.gz)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")
    defaults = SynthConfig()
    for f in fields(SynthConfig):
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, type=_bool, default=value, metavar="true|false", help=f"default {value}")
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"default {value}")


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.core.synth import SynthConfig, write_synthetic

    try:
        cfg = SynthConfig(**{f.name: getattr(args, f.name) for f in fields(SynthConfig)})
        n = write_synthetic(args.out, cfg)
    except (ValueError, OSError) as e:
        print(f"histospec trace synth: {e}", file=sys.stderr)
        return 2
    out = {"out": args.out, "records": n, "steps": cfg.epochs * cfg.steps_per_epoch, "config": {
        f.name: getattr(cfg, f.name) for f in fields(SynthConfig)}}  # fmt: skip
    print(json.dumps(out) if args.json else f"wrote {n} records to {args.out}")
    return 0
