"""Exact replay of every drafter at several budgets on several traces: a resumable cache and Markdown tables.

Each cell is what ``histospec replay TRACE --drafter D --budget N --json`` prints (the histospec cell also holds the
all-history oracle). Results are cached in ``--cache`` (one JSON object per line), so an interrupted run resumes and
a rerun only computes new cells. ``--hs KEY=VALUE,...`` replays histospec with DrafterConfig overrides (tuning
sweeps), labelled ``histospec[KEY=VALUE,...]``; ``--no-oracle`` skips the oracle (its cells leave ``oracle_tau``
empty). ``--schedule`` and ``--max-running`` pick the replay's schedule; a peer written ``NAME@step`` (e.g.
``sglang-ngram@step``) runs with ``peer_reset="step"`` (NGRAM as deployed). Every row records the schedule, the peer
reset and the commit it ran at.

Example::

    python scripts/replay_matrix.py docs/data/smollm2-arith.jsonl.gz --budgets 4,8,16,32 --cache build/replay.jsonl
    python scripts/replay_matrix.py docs/data/smollm2-*.jsonl.gz --drafters histospec --hs window=2
    python scripts/replay_matrix.py docs/data/smollm2-units.jsonl.gz --schedule sequential \
        --drafters histospec,sglang-ngram,sglang-ngram@step --cache build/units_sequential.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DEFAULT_DRAFTERS = "histospec,sglang-ngram,suffix,rhymerl,prompt-lookup"
PEER_OPTS = {"sglang-ngram": {"ngram_capacity": 2_000_000}}


def _overrides(text: str | None) -> dict:
    out = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        out[key] = value
    return out


def cell(trace: str, drafter: str, budget: int, hs: dict, schedule: dict, oracle: bool = True) -> dict:
    """One replay, as ``histospec replay --json`` reports it; ``drafter`` may carry ``@step`` (peer reset)."""
    from sglang_histospec.replay.drafters.registry import build_drafter
    from sglang_histospec.replay.simulator import ReplayConfig, replay
    from sglang_histospec.trace.format import load_steps

    steps, _ = load_steps(trace)
    name, _, reset = drafter.partition("@")
    ours = name == "histospec" and oracle
    cfg = ReplayConfig(budget=budget, oracle=ours, progress=False, oracle_all_history=ours, **schedule)
    opts = hs if name == "histospec" else dict(PEER_OPTS.get(name, {}), peer_reset=reset or None)
    res = replay(steps, build_drafter(name, budget, **opts), cfg).to_json()
    res.pop("per_step", None)
    res.update(schedule=cfg.schedule, max_running=cfg.width, peer_reset=reset or "never")
    return res


def _commit() -> str:
    """The commit the rows are computed at ("+dirty" when the work tree differs from it)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--drafters", default=DEFAULT_DRAFTERS)
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--hs", default=None, help="DrafterConfig overrides for histospec: KEY=VALUE,...")
    ap.add_argument("--cache", default="build/replay_matrix.jsonl")
    ap.add_argument("--schedule", default="lockstep", choices=("lockstep", "sequential"))
    ap.add_argument("--max-running", type=int, default=None)
    ap.add_argument("--no-oracle", action="store_true", help="skip the all-history oracle (histospec cells)")
    args = ap.parse_args(argv)
    schedule = {"schedule": args.schedule, "max_running": args.max_running}
    commit = _commit()
    hs = _overrides(args.hs)
    oracle = not args.no_oracle
    label = "histospec" + (f"[{args.hs}]" if args.hs else "")
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[(r["trace"], r["label"], r["budget"])] = r
    budgets = [int(b) for b in args.budgets.split(",")]
    for trace in args.traces:
        for drafter in args.drafters.split(","):
            name = label if drafter == "histospec" else drafter
            for n in budgets:
                if (trace, name, n) in done:
                    continue
                res = {
                    "trace": trace,
                    "label": name,
                    **cell(trace, drafter, n, hs, schedule, oracle),
                    "commit": commit,
                }
                done[(trace, name, n)] = res
                with cache.open("a") as f:
                    f.write(json.dumps(res) + "\n")
                print(f"{Path(trace).name} {name} N={n}: tau {res['tau']:.3f}", file=sys.stderr, flush=True)
    for trace in args.traces:
        print(table(trace, [r for (t, _, _), r in done.items() if t == trace], budgets))
    return 0


def table(trace: str, rows: list[dict], budgets: list[int]) -> str:
    """A Markdown table: one row per drafter (and the oracle), one column per budget."""
    by = {}
    for r in rows:
        by.setdefault(r["label"], {})[r["budget"]] = r
    lines = [f"\n{Path(trace).name}\n", "| drafter | " + " | ".join(f"N={n}" for n in budgets) + " |",
             "|---|" + "---|" * len(budgets)]  # fmt: skip
    for name in sorted(by, key=lambda s: (not s.startswith("histospec"), s)):
        lines.append(f"| {name} | " + " | ".join(_fmt(by[name].get(n), "tau") for n in budgets) + " |")
    if "histospec" in by:
        lines.append("| oracle (all history) | " + " | ".join(_fmt(by["histospec"].get(n), "oracle_tau")
                                                          for n in budgets) + " |")  # fmt: skip
    return "\n".join(lines)


def _fmt(r: dict | None, key: str) -> str:
    return "" if r is None or r.get(key) is None else f"{r[key]:.2f}"


if __name__ == "__main__":
    sys.exit(main())
