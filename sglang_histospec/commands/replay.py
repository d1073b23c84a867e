"""``histospec replay TRACE --drafter NAME --budget N``: exact offline acceptance of a drafter on a trace.

Example: ``histospec replay run.jsonl.gz --drafter histospec --budget 8 --json``. The last stdout line
(``--json``) holds ``drafter, budget, responses, tokens, verify_steps, tau, drafted, accepted, accept_rate,
oracle_tau, draft_us_p50, draft_us_p99`` (docs/replay.md section 4), ``est_speedup`` (always: with ``--verify-cost
FILE`` or the built-in default table, named in ``verify_cost``), plus ``schedule``, ``max_running``, ``peer_reset``,
``trace_sorted``, ``wall_s``, ``tokens_per_min`` and, with ``--per-step``, ``per_step``; lockstep adds
``projection`` (the projected rollout time on the verify-cost table against plain decoding and ``--compare``'s
drafter; per step with ``--per-step``). Semantics and proofs: docs/replay.md.

Example: ``histospec replay run.jsonl.gz --drafter histospec --budget 8 --verify-cost h100.json --policy adaptive
--compare sglang-ngram --json``.
"""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("replay",)
HELP = "replay a trace with a drafter: exact tau, acceptance and the history oracle (docs/replay.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.replay.drafters.registry import DRAFTERS, add_drafter_arguments
    from sglang_histospec.replay.projection import POLICIES
    from sglang_histospec.replay.simulator import SCHEDULES

    parser.add_argument("trace", help="JSONL(.gz) trace (docs/replay.md section 1)")
    parser.add_argument("--drafter", required=True, choices=DRAFTERS, help="which drafter to replay")
    parser.add_argument("--budget", type=int, required=True, help="N: at most N draft nodes per verify step")
    parser.add_argument(
        "--schedule", choices=SCHEDULES, default="lockstep",
        help="lockstep: a step's requests decode concurrently (default); sequential: one after another, shortest first",
    )  # fmt: skip
    parser.add_argument(
        "--max-running", type=int, default=None, metavar="N",
        help="lockstep: at most N requests at once, in (prompt, sample) order (default: all of a step's)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")
    parser.add_argument("--plot", metavar="PNG", default=None, help="write per-step tau and acceptance plots")
    parser.add_argument(
        "--verify-cost", metavar="FILE", default=None, help="verify-cost table (drafting/verify_cost.py)"
    )
    parser.add_argument("--batch", type=int, default=1, help="batch size at which the verify cost is read")
    parser.add_argument("--no-oracle", dest="oracle", action="store_false", help="skip oracle_tau (faster)")
    parser.add_argument(
        "--oracle-sources", default=None, help="comma list: oracle over these sources instead of the drafter's"
    )
    parser.add_argument(
        "--oracle-all-history", action="store_true", help="oracle over all earlier visits, not the drafter's window"
    )
    parser.add_argument("--per-step", action="store_true", help="include per-step totals in the JSON")
    g = parser.add_argument_group("projection (lockstep; docs/replay.md section 5)")
    g.add_argument(
        "--policy", choices=POLICIES, default="fixed",
        help="fixed: every draft verified whole; adaptive: the engine's cost cut on the verify-cost table",
    )  # fmt: skip
    g.add_argument("--host-speed", type=float, default=1.0, help="host CPU speed over this machine's (default 1)")
    g.add_argument(
        "--compare", default=None, choices=DRAFTERS, metavar="DRAFTER",
        help="also replay this drafter (a peer as deployed: its cache emptied every step) and give the ratio",
    )  # fmt: skip
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_drafter_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.replay.drafters.peers import PeerUnavailable
    from sglang_histospec.replay.simulator import replay
    from sglang_histospec.trace.format import TraceError, load_steps

    try:
        steps, was_sorted = load_steps(args.trace)
        cfg, drafter, proj = _setup(args)
        compare = _compare_drafter(args)
    except (TraceError, ValueError, OSError, PeerUnavailable) as e:
        print(f"histospec replay: {e}", file=sys.stderr)
        return 2
    if not was_sorted:
        print(
            "histospec replay: trace is not sorted by step; replaying its steps in increasing order", file=sys.stderr
        )
    res = replay(steps, drafter, cfg)
    out = res.to_json()
    out["schedule"] = cfg.schedule
    out["max_running"] = cfg.width
    out["peer_reset"] = args.peer_reset or "never"
    out["verify_cost"] = args.verify_cost or "default"
    out["batch"] = args.batch
    out["trace_sorted"] = was_sorted
    out["oracle_sources"] = list(cfg.oracle_sources or drafter.sources)
    out["oracle_window"] = None if cfg.oracle_all_history else drafter.window
    if proj is not None:
        out["projection"] = _projection(args, steps, cfg, proj, res, compare)
    if not args.per_step:
        out.pop("per_step")
    if args.plot:
        _plot(res, args.plot)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if k != "per_step":
                print(f"{k:>16}: {v}")
    return 0


def _setup(args: argparse.Namespace):  # noqa: ANN202
    """(ReplayConfig, drafter, ProjectionConfig or None) of the flags; raises ValueError on a bad combination."""
    from sglang_histospec.drafting.verify_cost import VerifyCostTable
    from sglang_histospec.replay.drafters.registry import build_drafter, drafter_options
    from sglang_histospec.replay.projection import ProjectionConfig, TableCut
    from sglang_histospec.replay.simulator import ReplayConfig

    table = VerifyCostTable.load(args.verify_cost) if args.verify_cost else VerifyCostTable.default()
    lockstep = args.schedule == "lockstep"
    proj = ProjectionConfig(table, host_speed=args.host_speed) if lockstep and table.ms is not None else None
    if args.policy == "adaptive" and proj is None:
        raise ValueError("--policy adaptive needs --schedule lockstep and a table with absolute pass times ('ms')")
    if args.compare and proj is None:
        raise ValueError("--compare needs --schedule lockstep and a table with absolute pass times ('ms')")
    drafter = build_drafter(args.drafter, args.budget, **drafter_options(args))
    cut = None
    if args.policy == "adaptive":
        calibration = getattr(getattr(drafter, "drafter", None), "calibration", None)
        if calibration is None:
            raise ValueError(
                f"--policy adaptive needs a drafter with calibrated probabilities (histospec), not {args.drafter}"
            )
        cut = TableCut(table, calibration, budget=args.budget, host_speed=args.host_speed)
    cfg = ReplayConfig(
        budget=args.budget,
        oracle=args.oracle,
        verify_cost=table,
        batch=args.batch,
        progress=args.progress,
        oracle_sources=None if args.oracle_sources is None else tuple(args.oracle_sources.split(",")),
        oracle_all_history=args.oracle_all_history,
        schedule=args.schedule,
        max_running=args.max_running,
        batch_drafts=lockstep,
        record_rounds=proj is not None,
        cut=cut,
    )
    return cfg, drafter, proj


def _compare_drafter(args: argparse.Namespace):  # noqa: ANN202
    """``--compare``'s drafter at the same budget; a peer as deployed in colocated RL (cache emptied every step)."""
    from sglang_histospec.replay.drafters.registry import PEERS, build_drafter

    if not args.compare:
        return None
    return build_drafter(args.compare, args.budget, peer_reset="step" if args.compare in PEERS else None)


def _projection(args, steps, cfg, proj, res, compare) -> dict:  # noqa: ANN001
    """The ``projection`` object: the drafter's projection, the table, and ``vs`` the compared drafter's."""
    import dataclasses

    from sglang_histospec.replay.projection import project
    from sglang_histospec.replay.simulator import admission_order, replay

    lengths = {st.step: [len(r.response) for r in admission_order(st.records, cfg.schedule)] for st in steps}
    total, per_step = project(res.rounds, lengths, cfg.width, proj)
    out = {"table": proj.table.label, "measured": proj.table.measured, "host_speed": proj.host_speed,
           "policy": args.policy, **total.to_json()}  # fmt: skip
    if cfg.cut is not None:
        out["cut"] = dict(cfg.cut.counts)
    if compare is not None:
        other_cfg = dataclasses.replace(cfg, oracle=False, cut=None, progress=False)
        other_res = replay(steps, compare, other_cfg)
        other, _ = project(other_res.rounds, lengths, cfg.width, proj)
        out["vs"] = {compare.name: {**other.to_json(), "tau": round(other_res.tau, 6),
                                    "peer_reset": "step" if compare.resets_each_step else "never",
                                    "ratio": round(other.ms / total.ms, 4) if total.ms > 0 else None}}  # fmt: skip
    if args.per_step:
        out["per_step"] = [{"step": s, **p.to_json()} for s, p in per_step.items()]
    return out


def _plot(res, path: str) -> None:  # noqa: ANN001
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [s.step for s in res.per_step]
    ax1.plot(steps, [s.tokens / max(s.verify_steps, 1) for s in res.per_step], "o-", label=f"{res.drafter} tau")
    if res.oracle_steps:
        ax1.plot(steps, [s.tokens / max(s.oracle_steps, 1) for s in res.per_step], "s--", label="oracle tau")
    ax1.set_xlabel("training step")
    ax1.set_ylabel("tokens per verify step")
    ax1.set_title(f"budget {res.budget}")
    ax1.legend()
    ax2.bar(range(len(res.accept_hist)), res.accept_hist)
    ax2.set_xlabel("accepted draft tokens per verify step")
    ax2.set_ylabel("verify steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
