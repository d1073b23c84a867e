"""What HistoSpec costs where it never drafts: four embedded engines side by side on ``bench engine``'s workload.

Builds, in this order, a plain engine, a HistoSpec engine whose governor never drafts (``explore_budget=0``), a
HistoSpec engine with the defaults and a second plain engine (the A/A), warms each up, and runs the epochs with
the engines taking steps in turn (``bench engine``'s interleaving, the heap frozen as there). Prints one JSON line:
per epoch each engine's tokens/s over the first plain engine's, the default engine's tau and governor counters
(since the start), and every engine's forward passes. A measuring aid for
docs/results.md ("Engine"), not a benchmark of its own. Example::

    python scripts/engine_floor.py --batch 16 --num-prompts 64 --epochs 4
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import sglang_histospec.commands.bench_engine as bench
from sglang_histospec.engine.governor import GovernorConfig
from sglang_histospec.engine.heap import frozen_heap
from sglang_histospec.models.demo_model import DEMO_MODELS, build_or_load_demo_model

NAMES = ("plain", "never", "histospec", "plain_aa")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_arguments(parser)
    args = parser.parse_args(["--quick-model", "--group-size", "8", "--no-hf", *argv])
    args.batch = int(args.batch)
    torch.set_num_threads(args.threads or 1)
    args.model = str(build_or_load_demo_model(config=DEMO_MODELS["quick"], progress=False))
    never = GovernorConfig(explore_budget=0.0)
    engines = [bench._make_engine(args, alg, args.batch, None, governor) for alg, governor in
               (("NONE", None), ("HISTOSPEC", never), ("HISTOSPEC", None), ("NONE", None))]  # fmt: skip
    prompt_ids, token_ids, _ = bench._prompts(args, engines[1].tokenizer, engines[1].vocab_size)
    for engine in engines:
        bench._warm_up(engine, None, token_ids, 0, args)
    rows = []
    with frozen_heap():
        for epoch in range(args.epochs):
            runs = bench._engines_epoch(engines, prompt_ids, token_ids, args, epoch)
            rate = [tokens / seconds for seconds, tokens, _ in runs]
            row = {name: rate[i] / rate[0] for i, name in enumerate(NAMES)}
            governor = engines[2].stats()["step_cost"]["governor"]  # counts since the start
            rows.append({"epoch": epoch, **row, "tau_histospec": runs[2][2]["tau"], "plain_tokens_per_s": rate[0],
                         "forwards": [r[2]["forwards"] for r in runs], "governor": governor})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"batch": args.batch, "num_prompts": len(token_ids), "per_epoch": rows}))


if __name__ == "__main__":
    main(sys.argv[1:])
