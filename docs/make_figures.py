"""Regenerate the README's plot: tau vs draft budget per drafter, by exact replay of the demo's real GRPO trace.

Every point is one ``histospec replay TRACE --drafter D --budget N --json --no-progress`` run; the raw JSON objects go
to ``--json-out`` (by default ``docs/data/results/replay_demo-grpo-trace_drafters_<date>_<commit>.json``, the file
docs/results.md renders its table from), so each plotted value can be traced to its run. The peers (``sglang-ngram``, ``suffix``) need ``make install-peers``; a drafter whose package
is missing is skipped with a note, never plotted with made-up values. tau is an exact count, so reruns give the same
figure on any machine (the drafter defaults at the time of the run decide it).

Example::

    .venv/bin/python docs/make_figures.py   # -> docs/img/tau_vs_budget.png, docs/data/results/replay_demo-grpo-trace_...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
DEFAULT_TRACE = DOCS / "data" / "demo_grpo_trace.jsonl.gz"
BUDGETS = (2, 4, 8, 16, 32)
# (drafter, extra flags, plot style).
DRAFTERS = (
    ("histospec", (), {"color": "C3", "marker": "o", "linewidth": 2.4}),
    ("sglang-ngram", ("--ngram-capacity", "200000"), {"color": "C0", "marker": "s"}),
    ("suffix", (), {"color": "C2", "marker": "^"}),
    ("rhymerl", (), {"color": "C1", "marker": "D"}),
    ("prompt-lookup", ("--pl-min", "2", "--pl-max", "4"), {"color": "C7", "marker": "v"}),
)


def replay(trace: Path, drafter: str, budget: int, flags: tuple[str, ...]) -> dict | None:
    """One ``histospec replay --json`` run; its last stdout line parsed, or None when the drafter is unavailable."""
    shown = trace.resolve().relative_to(REPO) if trace.resolve().is_relative_to(REPO) else trace
    cmd = [sys.executable, "-m", "sglang_histospec.cli", "replay", str(shown), "--drafter", drafter]
    cmd += ["--budget", str(budget), "--json", "--no-progress", *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"skipped {drafter} N={budget}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["command"] = "histospec " + " ".join(cmd[3:])
    return row


def default_json_out() -> Path:
    """``docs/data/results/replay_demo-grpo-trace_drafters_<date>_<commit>.json``."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    )
    name = f"replay_demo-grpo-trace_drafters_{date.today().isoformat()}_{commit.stdout.strip()}.json"
    return DOCS / "data" / "results" / name


def plot(rows: list[dict], trace: Path, out_png: Path) -> None:
    """Plot tau (solid) per drafter and histospec's oracle over its own sources (dashed) against the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.4, 4.2), dpi=120)
    for name, _, style in DRAFTERS:
        pts = sorted((r["budget"], r["tau"]) for r in rows if r["drafter"] == name)
        if pts:
            ax.plot(*zip(*pts), label=name, **style)
    oracle = sorted((r["budget"], r["oracle_tau"]) for r in rows if r["drafter"] == "histospec")
    if oracle:
        ax.plot(*zip(*oracle), "--", color="C3", alpha=0.6, label="oracle over histospec's sources")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(BUDGETS, [str(b) for b in BUDGETS])
    ax.set_xlabel("draft budget N (nodes per verify step)")
    ax.set_ylabel("tau (tokens per verify step)")
    ax.set_title(f"Exact replay of the demo's GRPO trace ({trace.name})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="rollout trace (.jsonl or .jsonl.gz)")
    parser.add_argument("--out", type=Path, default=DOCS / "img" / "tau_vs_budget.png", help="PNG to write")
    parser.add_argument("--json-out", type=Path, default=None, help="raw JSON of every run (default: see above)")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        raise ValueError(f"trace {args.trace} not found; pass --trace PATH to a trace written by `histospec demo`")
    rows = []
    for name, flags, _ in DRAFTERS:
        for budget in BUDGETS:
            row = replay(args.trace, name, budget, flags)
            if row is not None:
                rows.append(row)
                print(f"{name:14s} N={budget:2d} tau={row['tau']:.3f} oracle_tau={row['oracle_tau']:.3f}")
    if not rows:
        print("no drafter could be replayed; nothing plotted", file=sys.stderr)
        return 1
    plot(rows, args.trace, args.out)
    json_out = args.json_out or default_json_out()
    json_out.write_text(json.dumps(rows, indent=1) + "\n")
    print(json.dumps({"png": str(args.out), "runs": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
