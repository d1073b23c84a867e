"""``histospec bench draft TRACE``: the host cost of drafting a batch on a real trace, beside SGLang NGRAM.

History is every step before the last; ``--batch`` requests of the last step at random positions are drafted per
call, their committed tokens extended, and the same windows given to NGRAM's ``batch_get`` / ``batch_put`` when the
peers are installed (``make install-peers``). Keys: docs/results.md, "Draft cost".

Example: ``histospec bench draft docs/data/smollm2-ledger.jsonl.gz --batch 256 --budget 8 --json``
"""

from __future__ import annotations

import argparse

COMMAND = ("bench", "draft")
HELP = "Benchmark draft_batch at a batch on a real trace (history = every earlier step), beside SGLang NGRAM."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file (.jsonl or .jsonl.gz) with at least two steps")
    parser.add_argument("--batch", type=int, default=256, help="requests drafted per call")
    parser.add_argument("--budget", type=int, default=8, help="draft nodes per request")
    parser.add_argument("--rounds", type=int, default=40, help="timed calls")
    parser.add_argument("--warmup", type=int, default=4, help="untimed calls first")
    parser.add_argument(
        "--draft-threads", type=int, default=2, help="threads of a second drafter timed on the same windows (1: off)"
    )
    parser.add_argument("--no-ngram", action="store_true", help="do not time SGLang NGRAM even when installed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from sglang_histospec.replay.draft_bench import DraftBenchConfig, run_draft_bench
    from sglang_histospec.trace.format import load_steps

    try:
        cfg = DraftBenchConfig(
            batch=args.batch,
            budget=args.budget,
            rounds=args.rounds,
            warmup=args.warmup,
            draft_threads=args.draft_threads,
            ngram=not args.no_ngram,
            seed=args.seed,
        )
    except ValueError as e:
        raise SystemExit(str(e).replace("DraftBenchConfig.", "--").replace("_", "-")) from e
    steps, _ = load_steps(args.trace)

    def progress(msg: str) -> None:
        print(f"[bench draft] {msg}", file=sys.stderr, flush=True)

    result = run_draft_bench(steps, cfg, progress=progress).to_json()
    result["trace"] = args.trace
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:40s} {v}")
    return 0
