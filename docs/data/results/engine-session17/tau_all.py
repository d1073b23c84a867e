"""Bench workload at the demo shape: epoch 0 plain-recorded, then epochs with draft_selection=all (no cut, no governor): the drafts' real acceptance."""

import sys

import torch

from sglang_histospec.cli import build_parser
from sglang_histospec.commands import bench_engine as be
from sglang_histospec.drafting import BudgetConfig

MODEL = sys.argv[1]
EP = int(sys.argv[2])
SEL = sys.argv[3]
ADM = sys.argv[4]
args = build_parser().parse_args(
    [
        "bench",
        "engine",
        "--batch",
        "4",
        "--epochs",
        str(EP),
        "--no-hf",
        "--threads",
        "1",
        "--num-prompts",
        "4",
        "--task",
        "arith",
        "--group-size",
        "4",
        "--max-new-tokens",
        "128",
        "--draft-selection",
        SEL,
        "--admission",
        ADM,
    ]
)
torch.set_num_threads(1)
args.model = MODEL
budget = BudgetConfig(policy="fixed", fixed=16, cost_limit=None) if SEL == "all" else None
eng = be._make_engine(args, "HISTOSPEC", 4, budget)
prompt_ids, token_ids, _ = be._prompts(args, eng.tokenizer, eng.vocab_size)
be._warm_up(eng, None, token_ids, 0)
for epoch in range(EP):
    [(w, tok, info)] = be._engines_epoch([eng], prompt_ids, token_ids, args, epoch)
    print(
        f"epoch {epoch}: {tok / w:.1f} tok/s tau {info['tau']:.2f} drafted {info['drafted']} accepted {info['accepted']} forwards {info['forwards']}",
        flush=True,
    )
