"""``histospec demo``: GRPO on a real chat LLM with HistoSpec, timed side by side with plain decoding.

Default (``--model smollm2-135m-instruct``): prepare the model (``histospec model prepare``), warm it up once on
the task's reference solutions (cached), then one GRPO run with ``HistoSpecGRPOTrainer`` against a HistoSpec
rollout server whose every rollout is replayed on a plain-decoding server holding the same weights. ``--model
tiny``: the 100K-parameter toy (pretrained on CPU and cached), trained twice (with and without HistoSpec).

Example: ``histospec demo --quick --json`` prints a per-epoch table and ends with the summary object
(``epochs, reward_first, reward_last, tau_last, rollout_speedup, trace, per_epoch``, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from sglang_histospec.commands._flags import add_draft_selection_flag

COMMAND = ("demo",)
HELP = "end-to-end demo: GRPO on SmolLM2-135M-Instruct, rollouts timed with vs without HistoSpec"
TINY = "tiny"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a smaller run of the same (a few minutes once cached)")
    parser.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="a name of `histospec model prepare`, a model directory, or 'tiny' (the toy model)",
    )
    parser.add_argument("--family", default="arith", help="chat task family of a real model (tasks/chat.py)")
    parser.add_argument(
        "--policy",
        choices=("grpo", "frozen"),
        default="grpo",
        help="--model tiny only: grpo trains with HistoSpecGRPOTrainer (needs the trl extra); "
        "frozen samples the pretrained policy every epoch (no training)",
    )
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default 2 quick, 4 full)")  # fmt: skip
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="real model only: requests each rollout server decodes together (default 4: on a CPU larger batches "
        "are compute-bound and leave drafting little to gain)",
    )
    add_draft_selection_flag(parser)
    parser.add_argument("--out-dir", default="histospec-demo", help="trace, plots, summary.json and logs go here")
    parser.add_argument("--cache-dir", default=None, help="model cache (default $HISTOSPEC_CACHE_DIR or ~/.cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process (servers use 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")


def run(args: argparse.Namespace) -> int:
    import torch

    if args.epochs is not None and args.epochs < 1:
        raise SystemExit(f"--epochs {args.epochs}: use 1 or more")
    if args.threads < 1:
        raise SystemExit(f"--threads {args.threads}: use 1 or more")
    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    started = time.perf_counter()
    if args.model == TINY:
        rows, extra = _run_tiny(args, out, say)
    else:
        if args.policy != "grpo":
            raise SystemExit(f"--policy {args.policy}: only with --model tiny (a real model always trains)")
        rows, extra = _run_llm(args, out, say)
    _report(args, out, say, rows, {**extra, "seconds": time.perf_counter() - started})
    return 0


def _run_llm(args: argparse.Namespace, out: Path, say: Any) -> tuple[list, dict]:
    """Prepare and warm up the real model, then one side-by-side GRPO run."""
    from transformers import AutoTokenizer

    from sglang_histospec.demo.chat_demo import (
        WARMUP,
        ChatTask,
        demo_family,
        demo_run_config,
        warmed_policy,
        warmup_fields,
    )
    from sglang_histospec.demo.grpo import run_grpo, trainer_available
    from sglang_histospec.demo.report import side_by_side_epochs
    from sglang_histospec.models.prepare import resolve_model

    reason = trainer_available()
    if reason is not None:
        raise SystemExit(f"histospec demo trains with TRL, which does not import ({reason}); install the 'trl' extra")
    progress = not args.no_progress
    try:
        base = resolve_model(args.model, args.cache_dir, progress=progress)
        warm = dataclasses.replace(WARMUP, family=args.family, seed=args.seed)
        family = demo_family(args.family, demo_run_config(args.quick).num_prompts, args.seed)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    policy = warmed_policy(base, warm, args.cache_dir, progress=progress)
    cfg = dataclasses.replace(
        demo_run_config(args.quick, args.epochs, args.seed), draft_selection=args.draft_selection
    )
    if args.max_running_requests is not None:
        try:  # GRPORunConfig validates the value
            cfg = dataclasses.replace(cfg, max_running_requests=args.max_running_requests)
        except ValueError as exc:
            raise SystemExit(f"--max-running-requests: {exc}") from exc
    say(f"policy: {policy} ({args.model} after a supervised warm-up on {warm.warmup_examples} {args.family} "
        f"solutions); GRPO: {cfg.epochs} epochs x {cfg.num_prompts} prompts x G={cfg.group_size}, {cfg.max_running_requests} "
        "decoded together, every rollout replayed on a plain-decoding server with the same weights")  # fmt: skip
    task = ChatTask(family, AutoTokenizer.from_pretrained(policy))
    stats = run_grpo(policy, task, cfg, "HISTOSPEC", out / "work", out / "trace.jsonl.gz", progress)
    extra = {"model": args.model, "model_dir": str(policy), "base_model_dir": str(base), "family": args.family,
             "policy": "grpo", "config": dataclasses.asdict(cfg), "warmup": warmup_fields(warm),
             "identical_responses": sum(s.identical or 0 for s in stats), "responses": sum(s.responses for s in stats)}  # fmt: skip
    return side_by_side_epochs(stats), extra


def _run_tiny(args: argparse.Namespace, out: Path, say: Any) -> tuple[list, dict]:
    """The toy: pretrain (cached), then two runs, with and without HistoSpec."""
    from sglang_histospec.demo.grpo import GRPORunConfig, run_grpo, trainer_available
    from sglang_histospec.demo.report import compare_epochs
    from sglang_histospec.demo.rollouts import RolloutConfig, sample_epochs
    from sglang_histospec.models.demo_model import QUICK_CONFIG, DemoModelConfig, build_or_load_demo_model, load_meta
    from sglang_histospec.tasks.arith import ArithTask

    progress = not args.no_progress
    model_dir = build_or_load_demo_model(args.cache_dir, quick=args.quick, progress=progress)
    pre = load_meta(model_dir)["result"]
    last_eval = pre["evals"][-1]["reward"] if pre["evals"] else None
    say(f"demo model: {model_dir} ({pre['num_params']:,} params, {pre['steps']} pretraining steps, "
        f"T=1 reward at the end of pretraining: {last_eval})")  # fmt: skip
    task = ArithTask((QUICK_CONFIG if args.quick else DemoModelConfig()).task)  # the task the model learned
    missing: list[str] = []
    policy = args.policy
    if policy == "grpo" and (reason := trainer_available()) is not None:
        policy = "frozen"
        missing.append(f"GRPO training: the TRL trainer does not import ({reason}); install the 'trl' extra")
        say(f"NOTE: {missing[-1]}. Falling back to frozen-policy sampling (no training, real figures).")
    epochs = args.epochs or (2 if args.quick else 4)
    runs = {}
    for mode in ("HISTOSPEC", "NONE"):
        say(f"== {mode}: {'GRPO' if policy == 'grpo' else 'frozen-policy sampling'}, {epochs} epochs")
        trace_path = out / "trace.jsonl.gz" if mode == "HISTOSPEC" else None
        if policy == "grpo":
            cfg = GRPORunConfig(epochs=epochs, num_prompts=16 if args.quick else 32,
                                group_size=4 if args.quick else 8, prompts_per_step=8, seed=args.seed,
                                draft_selection=args.draft_selection)  # fmt: skip
            runs[mode] = run_grpo(model_dir, task, cfg, mode, out / f"work-{mode.lower()}", trace_path, progress)
        else:
            rcfg = RolloutConfig(epochs=epochs, group_size=4 if args.quick else 8,
                                 num_prompts=16 if args.quick else None, seed=args.seed,
                                 draft_selection=args.draft_selection)  # fmt: skip
            runs[mode] = sample_epochs(model_dir, task, rcfg, mode, trace_path, progress)
    extra = {"policy": policy, "model": TINY, "model_dir": str(model_dir), "model_params": pre["num_params"],
             "missing": missing}  # fmt: skip
    return compare_epochs(runs["HISTOSPEC"], runs["NONE"]), extra


def _report(args: argparse.Namespace, out: Path, say: Any, rows: list, extra: dict) -> None:
    """Print the table, write the plots and summary.json (and print it with --json)."""
    import json
    import os
    import platform

    import torch

    from sglang_histospec.demo.report import format_table, summary, write_plots

    say(format_table(rows))
    plots = write_plots(rows, out)
    trace = out / "trace.jsonl.gz"
    machine = f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s)"
    result = summary(rows, str(trace), quick=bool(args.quick), plots=plots, machine=machine, **extra)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    say(f"trace: {trace}\nplots: {', '.join(plots)}\nsummary: {out / 'summary.json'}")
    if extra.get("policy") == "frozen":
        say("Frozen policy: rewards do not improve by design (no training); rollout figures are real.")
    if args.json:
        print(json.dumps(result))
