"""``histospec bench index``: ingest speed, draft latency and memory of the history index on synthetic data.

A batch of requests decodes responses that resemble their prompts' synthetic history, driving the backend
interface the facade calls (``set_history``, ``start``, ``extend``, ``draft_batch``). Workload and every figure:
docs/results.md, "What the bench commands measure"; measured runs: its "History index" section.

Example: ``histospec bench index --prompts 8 --length 512 --steps 20 --json``
"""

from __future__ import annotations

import argparse

COMMAND = ("bench", "index")
HELP = "Benchmark the history index: ingest tokens/s, draft latency p50/p99 at a batch, bytes per token."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=256, help="prompts, and requests per decode step (batch)")
    parser.add_argument("--responses", type=int, default=16, help="history responses per prompt")
    parser.add_argument("--length", type=int, default=8192, help="tokens per response (L)")
    parser.add_argument("--similarity", type=float, default=0.9, help="per-token probability to copy the base")
    parser.add_argument("--vocab", type=int, default=32000, help="token ids are drawn from [0, vocab)")
    parser.add_argument("--budget", type=int, default=16, help="draft budget (nodes) per request-step")
    parser.add_argument("--steps", type=int, default=64, help="decode steps measured (each drafts the batch)")
    parser.add_argument(
        "--sources", default="history,siblings,self", help="comma-separated draft sources (DrafterConfig.sources)"
    )
    parser.add_argument("--chain", action="store_true", help="chain mode instead of trees (the counts scorer)")
    parser.add_argument(
        "--scorer",
        choices=("counts", "anchors"),
        default=None,
        help="DrafterConfig.scorer of both backends (default anchors; counts with --chain)",
    )
    parser.add_argument(
        "--draft-threads",
        type=int,
        default=2,
        help="threads of the native draft_batch on odd steps (even steps: one thread); reported as step_ms_threads",
    )
    parser.add_argument("--reference-prompts", type=int, default=4, help="prompts of the side-by-side run (0 = off)")
    parser.add_argument("--reference-length", type=int, default=1024, help="response length of the side-by-side run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import sys

    from sglang_histospec.drafting.index_bench import IndexBenchConfig, run_index_bench

    for name in ("prompts", "responses", "length", "steps", "vocab", "draft_threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)}: expected an int >= 1")
    if not 0.0 <= args.similarity <= 1.0:
        raise SystemExit(f"--similarity={args.similarity}: expected a float in [0, 1]")
    cfg = IndexBenchConfig(
        prompts=args.prompts,
        responses=args.responses,
        length=args.length,
        similarity=args.similarity,
        vocab=args.vocab,
        budget=args.budget,
        steps=args.steps,
        sources=tuple(s.strip() for s in args.sources.split(",") if s.strip()),
        tree=not args.chain,
        seed=args.seed,
        scorer=args.scorer or ("counts" if args.chain else "anchors"),
        draft_threads=args.draft_threads,
    )

    def progress(msg: str) -> None:
        print(f"[bench index] {msg}", file=sys.stderr, flush=True)

    result = run_index_bench(cfg, backend="native", progress=progress)
    if args.reference_prompts > 0:
        small = dataclasses.replace(cfg, prompts=args.reference_prompts, length=args.reference_length, steps=16)
        progress(f"side by side: {small.prompts} prompts x {small.responses} x {small.length} tokens")
        for backend in ("python", "native"):
            r = run_index_bench(small, backend=backend, progress=progress)
            keys = ("ingest_tokens_per_s", "draft_us_p50", "draft_us_p99", "draft_cpu_us_per_request", "tau")
            for key in keys:
                result[f"reference_{backend}_{key}"] = r[key]
        result["reference_history_tokens_per_prompt"] = small.responses * small.length
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:45s} {v}")
    return 0
