"""``histospec bench pipe``: every HistoPipe policy side by side, synchronous and with one-step overlap, in one run.

Example: ``histospec bench pipe --workers 8,32 --json`` simulates a long-tailed synthetic trace per worker count
(``--prompts-per-worker`` prompts per worker, so every worker holds the same load whatever W) or ``--trace``
(the same trace for every W) and prints, per worker count, mode and policy: makespan, lower bound, gap to the
bound, idle fraction (whole run, steady, and the floor the bound leaves), tail share and moved requests. The last
stdout line (``--json``) holds them all under ``results`` and a ``summary`` per worker count. ``histopipe-oracle``
plans with the realized lengths: the distance from it to ``histopipe`` is the cost of prediction error, from it to
the bound the bound's slack. Overlap runs are one step off-policy (pipe/simulator.py).
"""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("bench", "pipe")
HELP = "HistoPipe policies side by side (sync and one-step overlap) on long-tailed traces: idle, makespan, bound"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.commands.pipe_simulate import add_model_arguments
    from sglang_histospec.pipe.planner import POLICIES

    parser.add_argument("--trace", default=None, help="a rollout trace instead of synthetic ones")
    parser.add_argument("--workers", default="8,32", help="comma-separated worker counts")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies")
    parser.add_argument("--modes", default="sync,overlap", help="sync, overlap or both")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    s = parser.add_argument_group("synthetic trace (trace/synth.py), per worker count")
    s.add_argument("--prompts-per-worker", type=int, default=8, help="prompts per step and worker")
    s.add_argument("--group-size", type=int, default=16)
    s.add_argument("--epochs", type=int, default=5)
    s.add_argument("--steps-per-epoch", type=int, default=2)
    s.add_argument("--mean-len", type=float, default=128.0, help="median base length (before --length-scale)")
    s.add_argument("--length-sigma", type=float, default=1.0, help="log-normal sigma across prompts (long tail)")
    s.add_argument("--sample-length-sigma", type=float, default=0.15, help="log-normal sigma within a group")
    s.add_argument("--outlier-rate", type=float, default=0.0, help="share of responses stretched 3-10x (heavy tail)")
    s.add_argument("--outlier-scale", default="3,10", help="MIN,MAX stretch factor of those responses")
    s.add_argument("--max-len", type=int, default=2048, help="clip (before --length-scale)")
    s.add_argument("--seed", type=int, default=0)
    add_model_arguments(parser)
    parser.set_defaults(length_scale=8.0)


def _workload(args: argparse.Namespace, workers: int) -> list:
    from sglang_histospec.pipe.simulator import workload_from_trace
    from sglang_histospec.trace.format import TraceStep, load_steps
    from sglang_histospec.trace.synth import SynthConfig, generate

    if args.trace:
        return workload_from_trace(load_steps(args.trace)[0], args.length_scale)
    lo, hi = _scale_range(args.outlier_scale)
    cfg = SynthConfig(
        prompts=args.prompts_per_worker * workers * args.steps_per_epoch,
        group_size=args.group_size,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        mean_len=args.mean_len,
        length_sigma=args.length_sigma,
        max_len=args.max_len,
        sample_length_sigma=args.sample_length_sigma,
        outlier_rate=args.outlier_rate,
        outlier_min_scale=lo,
        outlier_max_scale=hi,
        vocab=1000,
        prompt_len=32,
        seed=args.seed,
    )
    by_step: dict[int, TraceStep] = {}
    for rec in generate(cfg):
        by_step.setdefault(rec.step, TraceStep(rec.step)).records.append(rec)
    return workload_from_trace([by_step[s] for s in sorted(by_step)], args.length_scale)


def _scale_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--outlier-scale {text!r}: give MIN,MAX, e.g. 3,10") from None
    return lo, hi


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sglang_histospec.commands.pipe_simulate import build_simulator

    try:
        workers = [int(w) for w in args.workers.split(",")]
        policies = args.policies.split(",")
        modes = args.modes.split(",")
        if any(m not in ("sync", "overlap") for m in modes) or any(w < 1 for w in workers):
            raise ValueError(f"--modes {args.modes!r} (sync,overlap) or --workers {args.workers!r} (ints >= 1)")
        for p in policies:
            build_simulator(args, p, 1, False)  # validates the policy and the model flags
        _scale_range(args.outlier_scale)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results, summary = [], {}
    variants = [(p, False) for p in policies] + ([("histopipe", True)] if "histopipe" in policies else [])
    runs = len(workers) * len(modes) * len(variants)
    print(
        f"{'W':>3} {'mode':>7} {'policy':>11} {'makespan_s':>11} {'bound_s':>9} {'gap':>7} {'idle':>6} {'steady':>6} {'floor':>6} {'tail':>6} {'moved':>5} {'warm_gap':>8}"
    )
    with tqdm(total=runs, desc="bench pipe", unit="run", file=sys.stderr) as bar:
        for w in workers:
            steps = _workload(args, w)
            for mode in modes:
                for policy, oracle in variants:
                    r = build_simulator(args, policy, w, mode == "overlap", oracle).run(steps).to_json()
                    r.pop("per_step")
                    if oracle:
                        r["policy"] = policy = f"{policy}-oracle"
                    r["requests"] = sum(len(s.requests()) for s in steps)
                    results.append(r)
                    warm = "-" if r["warm_bound_gap"] is None else f"{r['warm_bound_gap']:.1%}"
                    steady = "-" if r["steady_idle_fraction"] is None else f"{r['steady_idle_fraction']:.1%}"
                    print(
                        f"{w:>3} {mode:>7} {policy:>11} {r['makespan']:>11.1f} {r['lower_bound']:>9.1f} "
                        f"{r['bound_gap']:>7.1%} {r['idle_fraction']:>6.1%} {steady:>6} {r['idle_floor']:>6.1%} "
                        f"{r['tail_share']:>6.1%} "
                        f"{r['migrations']:>5} {warm:>8}"
                    )
                    bar.update(1)
            summary[str(w)] = _summary([r for r in results if r["workers"] == w])
    out = {
        "benchmark": "pipe",
        "trace": args.trace or "synthetic",
        "length_scale": args.length_scale,
        "results": results,
        "summary": summary,
    }
    if args.json:
        print(json.dumps(out))
    return 0


def _summary(rows: list[dict]) -> dict:
    """Per worker count: histopipe's gap to the bound (sync), idle fractions per policy and mode."""
    out: dict = {}
    for r in rows:
        mode = "overlap" if r["overlap"] else "sync"
        out[f"{r['policy']}_{mode}_idle"] = r["idle_fraction"]
        out[f"{r['policy']}_{mode}_steady_idle"] = r["steady_idle_fraction"]
        out[f"{r['policy']}_{mode}_idle_floor"] = r["idle_floor"]
        out[f"{r['policy']}_{mode}_gap"] = r["bound_gap"]
        out[f"{r['policy']}_{mode}_makespan"] = r["makespan"]
        if r["warm_bound_gap"] is not None:
            out[f"{r['policy']}_{mode}_warm_gap"] = r["warm_bound_gap"]
    return out
