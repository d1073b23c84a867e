"""HistoPipe's overlap flags on and off, on long-tailed synthetic traces and the real GRPO traces: one JSON file.

Each cell is one ``histospec bench pipe`` run (policy histopipe, one mode) with the flags of a variant, built by
that command's own parser, so a row reads as the command that gives it. Workloads: the synthetic trace of
docs/results.md's HistoPipe table (``S``), the long-tailed traces A and B of issue 15 (1, 2 and 4 groups per
worker; B also over 40 steps) and the four recorded SmolLM2 traces (``--length-scale 8``). The last stdout line is
the JSON object (``rows``: one per cell and variant; ``commit``).

Example::

    python scripts/pipe_flag_matrix.py --out docs/data/results/pipe_sim_flags_2026-12-06_abc1234.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T_A = (
    "--group-size 8 --length-sigma 0.8 --sample-length-sigma 0.4 --outlier-rate 0.03 --outlier-scale 3,3 --max-len 512"
)
T_B = "--group-size 8 --length-sigma 0.8 --sample-length-sigma 0.4 --outlier-rate 0.03 --outlier-scale 3,10 --max-len 2048"
TRACES = ("smollm2-arith", "smollm2-units", "smollm2-arith-light", "smollm2-units-light")


def workloads() -> list[tuple[str, int, str]]:
    """(name, W, flags) of every cell."""
    out = []
    for seed in (0, 1):
        out += [(f"S seed {seed}", w, f"--prompts-per-worker 4 --seed {seed}") for w in (8, 32)]
        for name, flags in (("A", T_A), ("B", T_B)):
            out += [
                (f"{name} P{p} seed {seed}", 32, f"{flags} --prompts-per-worker {p} --seed {seed}") for p in (1, 2, 4)
            ]
    out += [(f"B40 P{p} seed 0", 32, f"{T_B} --prompts-per-worker {p} --seed 0 --epochs 20") for p in (1, 2, 4)]
    for t in TRACES:
        out += [(t, w, f"--trace docs/data/{t}.jsonl.gz") for w in (4, 8, 16)]
    return out


def variants() -> list[tuple[str, str, str]]:
    """(label, mode, flags): every overlap rule on and off, and the combinations that matter."""
    out = [("sync", "sync", ""), ("sync spread off", "sync", "--sample-spread off")]
    for om in ("off", "drain", "always"):
        for steal in ("", " --steal"):
            for dsf in ("", " --defer-step-factor 3"):
                flags = f"--overlap-migration {om}{steal}{dsf}"
                out.append((f"pipeline {flags}", "overlap", flags))
    for flags in (
        "--overlap-migration off --max-deferrals 2",
        "--overlap-migration drain --steal --max-deferrals 2",
        "--overlap-migration drain --steal --defer-step-factor 3 --max-deferrals 2",
        "--overlap-migration off --sample-spread on",
        "--overlap-migration drain --steal --defer-step-factor 3 --sample-spread on",
        "--overlap-migration drain --steal --defer-step-factor 2",
        "--overlap-migration drain --steal --defer-step-factor 4",
    ):
        out.append((f"pipeline {flags}", "overlap", flags))
    for extra in ("", " --defer-step-factor 3", " --max-deferrals 2", " --defer-step-factor 3 --max-deferrals 2"):
        out.append((f"router{extra}", "overlap", f"--router-gate --overlap-migration stay{extra}"))
    out.append(("router --sample-spread on", "overlap", "--router-gate --overlap-migration stay --sample-spread on"))
    return out


def run_cell(workers: int, wflags: str, mode: str, vflags: str) -> dict:
    """One ``histospec bench pipe`` run of histopipe, as its --json row."""
    from sglang_histospec.commands import bench_pipe
    from sglang_histospec.commands.pipe_simulate import build_simulator

    parser = argparse.ArgumentParser()
    bench_pipe.add_arguments(parser)
    args = parser.parse_args(shlex.split(f"--workers {workers} {wflags} {vflags}"))
    steps = bench_pipe._workload(args, workers)
    row = build_simulator(args, "histopipe", workers, mode == "overlap").run(steps).to_json()
    row.pop("per_step")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--only", default=None, help="run only workloads whose name starts with this")
    args = ap.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = []
    for name, workers, wflags in workloads():
        if args.only and not name.startswith(args.only):
            continue
        t0 = time.time()
        for label, mode, vflags in variants():
            row = run_cell(workers, wflags, mode, vflags)
            rows.append({"workload": name, "W": workers, "variant": label, "mode": mode, "flags": vflags, **row})
        print(f"{name} W={workers}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    out = {"benchmark": "pipe_flags", "commit": commit, "workload_flags": workloads(), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"rows": len(rows), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
