"""``histospec pipe simulate``: replay a trace's steps on W simulated rollout workers under a HistoPipe policy.

Example: ``histospec pipe simulate run.jsonl.gz --workers 8 --policy histopipe --overlap --json``.
The last stdout line (``--json``) holds ``policy, workers, steps, makespan, lower_bound, idle_fraction,
tail_share, migrations`` plus ``overlap``, ``bound_gap`` and ``per_step``. The model and
the metrics are defined in ``sglang_histospec/pipe/simulator.py``; ``--overlap`` runs one step off-policy.
"""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("pipe", "simulate")
HELP = "simulate a trace's rollout steps on W workers under a HistoPipe policy (idle time, makespan, bound)"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Cost model, predictor and planner flags shared with ``histospec bench pipe``."""
    from sglang_histospec.pipe.worker_cost import CostModelConfig

    d = CostModelConfig()
    g = parser.add_argument_group("worker cost model (seconds; see pipe/worker_cost.py)")
    g.add_argument("--iteration-s", type=float, default=d.iteration_s, help="fixed time per decode iteration")
    g.add_argument("--per-request-s", type=float, default=d.per_request_s, help="per running request per iteration")
    g.add_argument("--per-context-token-s", type=float, default=d.per_context_token_s, help="per context token")
    g.add_argument("--prefill-token-s", type=float, default=d.prefill_token_s, help="per prefilled token")
    g.add_argument("--max-running", type=int, default=d.max_running, help="batch cap per worker")
    g.add_argument("--tau", type=float, default=d.tau, help="tokens per iteration (HistoSpec acceptance length)")
    g.add_argument("--length-scale", type=float, default=1.0, help="multiply every prompt and response length")
    p = parser.add_argument_group("planner")
    p.add_argument("--window", type=int, default=2, help="visits of a prompt kept by the length predictor")
    p.add_argument("--quantile", type=float, default=None, help="predict lengths by this quantile (default: mean)")
    p.add_argument("--no-split", dest="split", action="store_false", help="histopipe without tier 2")
    p.add_argument("--no-outliers", dest="outliers", action="store_false", help="never migrate or defer")
    p.add_argument(
        "--split-error-quantile",
        type=_quantile_arg,
        default="auto",
        help="tier 2 sizes pieces for this quantile of observed actual/predicted length ('none': as predicted; "
        "'auto': 0.9 with --overlap, none without)",
    )
    p.add_argument("--outlier-factor", type=float, default=1.5)
    p.add_argument("--tail-fraction", type=float, default=0.10)
    p.add_argument(
        "--max-deferrals",
        type=int,
        default=1,
        help="overlap: times one outlier may be deferred (more: shorter runs, but each deferral leaves its "
        "response one more step off-policy)",
    )
    p.add_argument(
        "--router-gate",
        action="store_true",
        help="overlap: model histospec route --overlap instead of the pipeline (step s starts once step s-1 is "
        "complete, on every worker at once; deferred requests keep running where they are; nothing migrates or is "
        "stolen; the router's defer step factor)",
    )


def _quantile_arg(text: str) -> float | str | None:
    return text.lower() if text.lower() in ("none", "auto") else float(text)


def _split_quantile(value: float | str | None, overlap: bool) -> float | None:
    if value == "auto":
        return 0.9 if overlap else None
    return None if value == "none" else value


def build_simulator(args: argparse.Namespace, policy: str, workers: int, overlap: bool, oracle: bool = False):  # noqa: ANN201
    from sglang_histospec.pipe.lengths import LengthPredictorConfig
    from sglang_histospec.pipe.planner import PlannerConfig
    from sglang_histospec.pipe.simulator import PipeSimConfig, PipeSimulator
    from sglang_histospec.pipe.worker_cost import CostModel, CostModelConfig

    cost = CostModel(
        CostModelConfig(
            iteration_s=args.iteration_s,
            per_request_s=args.per_request_s,
            per_context_token_s=args.per_context_token_s,
            prefill_token_s=args.prefill_token_s,
            max_running=args.max_running,
            tau=args.tau,
        )
    )
    planner = PlannerConfig(
        policy=policy,
        length_quantile=args.quantile,
        split=args.split,
        split_error_quantile=_split_quantile(args.split_error_quantile, overlap),
        outlier_factor=args.outlier_factor,
        tail_fraction=args.tail_fraction,
        max_deferrals=args.max_deferrals,
    )
    return PipeSimulator(
        PipeSimConfig(
            workers=workers,
            overlap=overlap,
            outliers=args.outliers,
            oracle=oracle,
            router_gate=args.router_gate,
        ),
        planner,
        cost,
        LengthPredictorConfig(window=args.window),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.pipe.planner import POLICIES

    parser.add_argument("trace", help="rollout trace (.jsonl or .jsonl.gz, docs/replay.md section 1)")
    parser.add_argument("--workers", type=int, default=8, help="rollout workers (W)")
    parser.add_argument("--policy", choices=POLICIES, default="histopipe")
    parser.add_argument("--overlap", action="store_true", help="one-step overlap (ONE STEP OFF-POLICY; opt-in)")
    parser.add_argument("--oracle", action="store_true", help="plan with the realized lengths (a reference)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    parser.add_argument("--plot", default=None, metavar="PNG", help="plot per-step makespan against the bound")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sglang_histospec.pipe.simulator import workload_from_trace
    from sglang_histospec.trace.format import load_steps

    try:
        steps = workload_from_trace(load_steps(args.trace)[0], args.length_scale)
        sim = build_simulator(args, args.policy, args.workers, args.overlap, args.oracle)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not steps:
        print(f"error: {args.trace}: no steps", file=sys.stderr)
        return 2
    with tqdm(total=len(steps), desc=f"simulate {args.policy}", unit="step", file=sys.stderr) as bar:
        result = sim.run(steps, progress=lambda n: bar.update(n - bar.n))
    out = result.to_json()
    print(f"{'step':>6} {'requests':>8} {'makespan_s':>11} {'bound_s':>9} {'tail_s':>8} {'moved':>5}")
    for s in result.per_step:
        print(
            f"{s.step:>6} {s.requests:>8} {s.makespan:>11.2f} {s.lower_bound:>9.2f} {s.tail_s:>8.2f} {s.migrations:>5}"
        )
    print(
        f"{args.policy} W={args.workers}{' overlap (one step off-policy)' if args.overlap else ''}: "
        f"makespan {result.makespan:.2f} s, bound {result.lower_bound:.2f} s (+{out['bound_gap']:.1%}), "
        f"idle {result.idle_fraction:.1%}, tail {result.tail_share:.1%}, moved {result.migrations}"
    )
    if args.plot:
        plot_steps(result, args.plot)
    if args.json:
        print(json.dumps(out))
    return 0


def plot_steps(result, path: str) -> None:  # noqa: ANN001
    """Per-step makespan and lower bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s.step for s in result.per_step]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(steps, [s.makespan for s in result.per_step], color="tab:blue", alpha=0.7, label="makespan")
    ax.plot(steps, [s.lower_bound for s in result.per_step], "k_", markersize=14, mew=2, label="lower bound")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    mode = "one-step overlap" if result.overlap else "synchronous"
    ax.set_title(f"{result.policy}, {result.workers} workers, {mode}: idle {result.idle_fraction:.1%}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
