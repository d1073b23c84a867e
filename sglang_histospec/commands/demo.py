"""``histospec demo``: the end-to-end CPU demo (pretrain a tiny model, then RL with and without HistoSpec).

Example: ``histospec demo --quick --json`` prints a per-epoch table and ends with the summary object
(``epochs, reward_first, reward_last, tau_last, rollout_speedup, trace``, ...).
"""

from __future__ import annotations

import argparse

COMMAND = ("demo",)
HELP = "end-to-end demo: pretrain a tiny model on a bundled task, then GRPO rollouts with vs without HistoSpec"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small model and run (1-2 minutes once cached)")
    parser.add_argument("--policy", choices=("grpo", "frozen"), default="grpo",
                        help="grpo: train with HistoSpecGRPOTrainer (needs the trl extra); frozen: sample the "
                        "pretrained policy every epoch through the embedded engine (no training)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 2 quick, 4 full)")
    parser.add_argument("--out-dir", default="histospec-demo", help="trace, plots, summary.json and logs go here")
    parser.add_argument("--cache-dir", default=None, help="model cache (default $HISTOSPEC_CACHE_DIR or ~/.cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process (servers use 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import platform
    import sys
    import time
    from pathlib import Path

    import torch

    from sglang_histospec.demo import QUICK_CONFIG, ArithTask, DemoModelConfig, build_or_load_demo_model, load_meta
    from sglang_histospec.demo.grpo import GRPORunConfig, run_grpo, trainer_available
    from sglang_histospec.demo.report import compare_epochs, format_table, summary, write_plots
    from sglang_histospec.demo.rollouts import RolloutConfig, sample_epochs

    if args.epochs is not None and args.epochs < 1:
        raise SystemExit(f"--epochs {args.epochs}: use 1 or more")
    if args.threads < 1:
        raise SystemExit(f"--threads {args.threads}: use 1 or more")
    torch.set_num_threads(args.threads)
    progress = not args.no_progress
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    started = time.perf_counter()

    model_dir = build_or_load_demo_model(args.cache_dir, quick=args.quick, progress=progress)
    meta = load_meta(model_dir)
    pre = meta["result"]
    last_eval = pre["evals"][-1]["reward"] if pre["evals"] else None
    say(f"demo model: {model_dir} ({pre['num_params']:,} params, {pre['steps']} pretraining steps, "
        f"T=1 reward at the end of pretraining: {last_eval})")  # fmt: skip
    task = ArithTask((QUICK_CONFIG if args.quick else DemoModelConfig()).task)  # the task the model learned

    missing: list[str] = []
    policy = args.policy
    if policy == "grpo":
        reason = trainer_available()
        if reason is not None:
            policy = "frozen"
            missing.append(f"GRPO training: the TRL trainer does not import ({reason}); install the 'trl' extra")
            say(f"NOTE: {missing[-1]}. Falling back to frozen-policy sampling (no training, real figures).")
    epochs = args.epochs or (2 if args.quick else 4)
    trace = out / "trace.jsonl.gz"
    runs = {}
    for mode in ("HISTOSPEC", "NONE"):
        say(f"== {mode}: {'GRPO' if policy == 'grpo' else 'frozen-policy sampling'}, {epochs} epochs")
        trace_path = trace if mode == "HISTOSPEC" else None
        if policy == "grpo":
            cfg = GRPORunConfig(
                epochs=epochs,
                num_prompts=16 if args.quick else 32,
                group_size=4 if args.quick else 8,
                prompts_per_step=8,
                seed=args.seed,
            )
            runs[mode] = run_grpo(model_dir, task, cfg, mode, out / f"work-{mode.lower()}", trace_path, progress)
        else:
            cfg = RolloutConfig(
                epochs=epochs,
                group_size=4 if args.quick else 8,
                num_prompts=16 if args.quick else None,
                seed=args.seed,
            )
            runs[mode] = sample_epochs(model_dir, task, cfg, mode, trace_path, progress)

    rows = compare_epochs(runs["HISTOSPEC"], runs["NONE"])
    say(format_table(rows))
    plots = write_plots(rows, out)
    result = summary(
        rows,
        str(trace),
        policy=policy,
        quick=bool(args.quick),
        plots=plots,
        model_dir=str(model_dir),
        model_params=pre["num_params"],
        missing=missing,
        seconds=time.perf_counter() - started,
        machine=f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s)",
    )
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    say(f"trace: {trace}\nplots: {', '.join(plots)}\nsummary: {out / 'summary.json'}")
    if policy == "frozen":
        say("Frozen policy: rewards do not improve by design (no training); rollout figures are real.")
    if args.json:
        print(json.dumps(result))
    return 0
