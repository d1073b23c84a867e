"""Projected rollout time of every SmolLM2 trace on verify-cost tables: HistoSpec (adaptive and fixed) against NGRAM
as deployed and plain decoding, at host speeds 1 and 3; one JSON row per cell, resumable.

Each cell is what ``histospec replay TRACE --drafter histospec --budget N --policy P --verify-cost TABLE --host-speed S
--compare sglang-ngram --no-oracle --json`` prints as ``projection`` (docs/replay.md section 5), computed with fewer
replays: NGRAM and the fixed policy replay once per trace and are projected on every table and host speed; the adaptive
policy, whose decisions depend on both, replays per cell. A **projection, not a measurement**.

Example::

    python scripts/projection_matrix.py --out docs/data/results/projection_2026-12-07_abc1234.jsonl \\
        --tables default,docs/data/results/verify_cost_cpu_smollm2-135m_2026-12-07_abc1234.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sglang_histospec.drafting.verify_cost import VerifyCostTable  # noqa: E402
from sglang_histospec.replay.drafters.registry import build_drafter  # noqa: E402
from sglang_histospec.replay.projection import ProjectionConfig, TableCut, project  # noqa: E402
from sglang_histospec.replay.simulator import ReplayConfig, admission_order, replay  # noqa: E402
from sglang_histospec.trace.format import load_steps  # noqa: E402

TRACES = tuple(f"docs/data/smollm2-{t}.jsonl.gz" for t in ("arith", "arith-light", "units", "units-light", "ledger",
                                                            "report"))  # fmt: skip
SPEEDS = (1.0, 3.0)


def _key(row: dict) -> tuple:
    return row["trace"], row["table_file"], row["host_speed"], row["policy"], row["budget"]


def _done(path: Path) -> set[tuple]:
    if not path.exists():
        return set()
    return {_key(json.loads(line)) for line in path.read_text().splitlines() if line.strip()}


def _table(spec: str) -> VerifyCostTable:
    return VerifyCostTable.default() if spec == "default" else VerifyCostTable.load(spec)


def _replay(steps, name: str, budget: int, cut=None, drafter=None):  # noqa: ANN001, ANN202
    d = drafter or build_drafter(name, budget, peer_reset="step" if name == "sglang-ngram" else None)
    cfg = ReplayConfig(budget=budget, oracle=False, batch_drafts=True, record_rounds=True, cut=cut)
    return replay(steps, d, cfg)


def _row(trace: str, spec: str, speed: float, policy: str, budget: int, res, ngram, lengths, table) -> dict:  # noqa: ANN001
    cfg = ProjectionConfig(table, host_speed=speed)
    ours, _ = project(res.rounds, lengths, None, cfg)
    peer, _ = project(ngram.rounds, lengths, None, cfg)
    return {
        "trace": trace, "table_file": spec, "table": table.label, "measured": table.measured, "host_speed": speed,
        "policy": policy, "budget": budget, "tau": round(res.tau, 6), "ngram_tau": round(ngram.tau, 6),
        "projection": ours.to_json(), "ngram": peer.to_json(), "vs_ngram": round(peer.ms / ours.ms, 4),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }  # fmt: skip


def run_trace(trace: str, specs: list[str], budget: int, out: Path) -> None:
    """Every missing cell of ``trace``: NGRAM and the fixed policy once, the adaptive policy per table and speed."""
    done = _done(out)
    cells = [(s, v, p) for s in specs for v in SPEEDS for p in ("adaptive", "fixed")]
    cells = [c for c in cells if (trace, c[0], c[1], c[2], budget) not in done]
    if not cells:
        return
    steps, _ = load_steps(ROOT / trace)
    lengths = {st.step: [len(r.response) for r in admission_order(st.records, "lockstep")] for st in steps}
    ngram = _replay(steps, "sglang-ngram", budget)
    fixed = _replay(steps, "histospec", budget) if any(p == "fixed" for _, _, p in cells) else None
    for spec, speed, policy in cells:
        table = _table(spec)
        if policy == "fixed":
            res = fixed
        else:
            drafter = build_drafter("histospec", budget)
            cut = TableCut(table, drafter.drafter.calibration, budget=budget, host_speed=speed)
            res = _replay(steps, "histospec", budget, cut=cut, drafter=drafter)
        row = _row(trace, spec, speed, policy, budget, res, ngram, lengths, table)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        p = row["projection"]
        print(f"{trace} {spec} x{speed} {policy}: {p['speedup']:.2f}x plain, {row['vs_ngram']:.2f}x NGRAM", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSONL file, appended to (cells already in it are skipped)")
    parser.add_argument("--tables", default="default", help="comma list: 'default' or verify-cost files")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--budget", type=int, default=8)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for trace in args.traces.split(","):
        run_trace(trace, args.tables.split(","), args.budget, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
