"""``histospec trace stats TRACE``: token reuse and length stability between adjacent epochs.

Example: ``histospec trace stats run.jsonl.gz --min-match 4 --json --plot stats/``. The last stdout line
(``--json``) holds ``epochs`` and ``pairs`` (per adjacent-epoch pair: ``token_reuse``, its per-response mean and
p10/p50/p90, ``spearman``, ``kendall``, ``rank_moved_share``), the same four keys averaged over pairs, and
length percentiles. Definitions: ``sglang_histospec/trace/stats.py`` and docs/replay.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

COMMAND = ("trace", "stats")
HELP = "token reuse and length-rank stability between adjacent epochs of a trace (RhymeRL's observations)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="JSONL(.gz) trace")
    parser.add_argument("--min-match", type=int, default=4, help="m: shortest match that counts as reuse")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")
    parser.add_argument("--plot", metavar="DIR", default=None, help="write reuse and length plots into DIR")


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.trace.format import TraceError, read_trace
    from sglang_histospec.trace.stats import trace_stats

    try:
        stats = trace_stats(read_trace(args.trace), args.min_match)
    except (TraceError, ValueError, OSError) as e:
        print(f"histospec trace stats: {e}", file=sys.stderr)
        return 2
    out = stats.to_json()
    if args.plot:
        _plot(stats, args.plot)
        out["plots"] = args.plot
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if k != "pairs":
                print(f"{k:>18}: {v}")
        for p in out["pairs"]:
            print(
                f"epochs {p['epochs']}: reuse {p['token_reuse']}, spearman {p['spearman']}, kendall {p['kendall']}, "
                f"rank moved > decile {p['rank_moved_share']} ({p['prompts']} prompts)"
            )
    if not stats.pairs:
        print("histospec trace stats: no two adjacent epochs share a prompt; nothing to compare", file=sys.stderr)
    return 0


def _plot(stats, out_dir: str) -> None:  # noqa: ANN001
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, name: str) -> None:  # noqa: ANN001
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=120)
        plt.close(fig)

    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in stats.pairs:
        ax.hist(p.reuse_shares, bins=40, range=(0, 1), histtype="step", label=f"epoch {p.epochs[0]}->{p.epochs[1]}")
    ax.set_xlabel(f"share of a response's tokens reusable (match >= {stats.min_match})")
    ax.set_ylabel("responses")
    if stats.pairs:
        ax.legend()
    save(fig, "token_reuse.png")
    fig, ax = plt.subplots(figsize=(5, 5))
    for p in stats.pairs:
        ax.scatter(p.mean_lengths[0], p.mean_lengths[1], s=6, label=f"epoch {p.epochs[0]}->{p.epochs[1]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean response length, epoch e")
    ax.set_ylabel("mean response length, epoch e+1")
    if stats.pairs:
        ax.legend()
    save(fig, "length_stability.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(stats.lengths, bins=60, log=True)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("responses")
    save(fig, "lengths.png")
