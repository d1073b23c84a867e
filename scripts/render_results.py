"""Render the results tables of docs/results.md and README.md from the benchmark JSON under docs/data/results/.

A table sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``; this script rewrites what lies between
the two markers and leaves the prose around them alone. A result file is named ``<what>_<date>_<commit>.<ext>``
(``bench_index_2026-12-06_8badfa3.jsonl``): the date and commit it was measured at, which every table prints.
``--check`` changes nothing and exits 1 if a file differs from what it renders (tests/test_results_docs.py);
``--run`` reruns the headline benchmarks (``make results-run``, about 30 minutes) and refreshes the JSON.

Example::

    python scripts/render_results.py                 # rewrite the tables in README.md and docs/results.md
    python scripts/render_results.py --check         # exit 1 if either file is stale
    python scripts/render_results.py --run --dry-run # list what --run would run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "data" / "results"
DOCS = (REPO / "README.md", REPO / "docs" / "results.md")
MACHINE = "2-vCPU VM, no GPU"
MARKER = re.compile(r"<!-- results:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.S)
NAME = re.compile(r"^(?P<what>.+)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<commit>[0-9a-f]{7,40})\.(?P<ext>jsonl?|txt)$")
LOCKSTEP = re.compile(r"^replay_(?P<trace>.+)_(?P<schedule>sequential|lockstep)\.jsonl$")
SMOLLM2_TRACES = ("smollm2-arith", "smollm2-units", "smollm2-arith-light", "smollm2-units-light")
LONG_TRACES = ("smollm2-report", "smollm2-ledger")  # 1,024-token responses (docs/data/README.md)
HELD_OUT = {"smollm2-units", "smollm2-units-light", "smollm2-report"}
PEERS = ("sglang-ngram", "suffix", "rhymerl")
DRAFT_TARGET = 1.3  # tau >= 1.3x the best same-corpus peer at N = 8 and 16
DEPLOYED_TARGET = 1.5  # tau >= 1.5x NGRAM as deployed (its trie emptied at every step)
ENGINE_FLOOR = 0.97  # issue 13: never below 0.97x of plain in any epoch
ENGINE_TARGET = 1.5  # issue 13: >= 1.5x at batch 1 and 4 after two epochs of history
GENERATE_TARGET = 1.3  # issue 13: plain engine >= 1.3x transformers generate
IDLE_TARGET = 0.10  # issue 6: one-step overlap idle <= 10 % at W = 32
INDEX_TARGETS = {
    "draft_us_p50": 5.0,
    "draft_us_p99": 50.0,
    "step_ms_threads": 1.0,
    "ingest_tokens_per_s": 10e6,
    "bytes_per_token": 48.0,
}
"""Issue 2's targets at batch 256 (issue 46: the batch's draft step on 2 threads): latency and memory at most,
ingest (per CPU second) at least."""
PROJECTION_TARGETS = {"plain": 2.1, "ngram": 1.3}
"""Issue 54's aim on the long traces on a GPU's table: projected rollout time >= 2.1x plain, >= 1.3x NGRAM as deployed."""
DRAFT_COST_TARGETS = {"draft_us_p50": 10.0, "p99_over_p50": 2.0, "step_ms_threads": 1.5, "ratio": 0.5, "growth": 1.5}
"""Issue 53's targets for ``bench draft`` at batch 256, budget 8: us per request, the batch call's p99 / p50, the
call on 2 threads (ms), ours / NGRAM's ``batch_get``, and the growth per request from ~600- to 4K-token responses."""
SYNTH_SHORT, SYNTH_LONG, SYNTH_MANY = ("build/synth-600.jsonl.gz", "build/synth-4096.jsonl.gz",
                                      "build/synth-many.jsonl.gz")  # fmt: skip
SYNTH_CMD = (
    "histospec trace synth build/synth-{n}.jsonl.gz --prompts 8 --group-size 8 --epochs 6 --vocab 49152 "
    "--mean-len {n} --length-sigma 0.3 --max-len {m} --seed 0"
)
SYNTH_MANY_CMD = (
    "histospec trace synth build/synth-many.jsonl.gz --prompts 256 --group-size 8 --epochs 4 --vocab 49152 "
    "--mean-len 300 --length-sigma 0.3 --max-len 600 --seed 0"
)
DRAFT_TRACES = (
    "docs/data/smollm2-ledger.jsonl.gz", "docs/data/smollm2-report.jsonl.gz", SYNTH_SHORT, SYNTH_LONG, SYNTH_MANY,
    "docs/data/smollm2-arith.jsonl.gz", "docs/data/smollm2-units.jsonl.gz",
)  # fmt: skip


@dataclass(frozen=True)
class Result:
    """One committed result file and what its name says: what it measures, its date and commit."""

    path: Path
    what: str
    date: str
    commit: str

    def rows(self) -> list[dict]:
        """The file's JSON objects (a .jsonl file's lines, a .json file's object or list), in order."""
        text = self.path.read_text()
        if self.path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
        return data if isinstance(data, list) else [data]

    def one(self) -> dict:
        return self.rows()[-1]


def find(what: str, results: Path = RESULTS) -> Result:
    """The one file ``<what>_<date>_<commit>.*`` in ``results``; ValueError naming the fix if none or several.

    Example: ``find("bench_index")`` -> ``Result(path=.../bench_index_2026-12-06_8badfa3.jsonl, commit="8badfa3", ...)``.
    """
    found = []
    for path in sorted(results.iterdir()):
        m = NAME.match(path.name)
        if m and m["what"] == what:
            found.append(Result(path, what, m["date"], m["commit"]))
    if len(found) != 1:
        names = [r.path.name for r in found]
        raise ValueError(
            f"{what}: expected one file {what}_<date>_<commit>.json[l] in {results}, found {names}; "
            "keep the newest (git rm the others) or rerun `make results-run`"
        )
    return found[0]


# ---------------------------------------------------------------- formatting


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def f2(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def ratio(x: float, floor: float | None = None) -> str:
    """``1.33x``; bold when below ``floor`` (a missed target)."""
    text = f"{x:.2f}x" if x >= 0.995 or floor is None else f"{x:.3f}x"
    return f"**{text}**" if floor is not None and x < floor else text


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def link(result: Result, doc: Path) -> str:
    rel = os.path.relpath(result.path, doc.parent)
    return f"[`{result.what}`]({rel})"


def source(results: list[Result], doc: Path, command: str) -> str:
    """The line under a table: its files grouped by date and commit, the machine and the command.

    Example: ``Source: [`bench_index`](data/results/bench_index_2026-12-06_8badfa3.jsonl) (2026-12-06, commit
    `8badfa3`); 2-vCPU VM, no GPU. Command: `histospec bench index --json`.``
    """
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.date, r.commit), []).append(r)
    where = "; ".join(", ".join(link(r, doc) for r in rs) + f" ({d}, commit `{c}`)" for (d, c), rs in groups.items())
    return f"\nSource: {where}; {MACHINE}. Command: `{command}`."


# ---------------------------------------------------------------- data


def smollm2_tau(trace: str) -> dict[tuple[str, int], dict]:
    """{(drafter, budget): replay row} for one SmolLM2 trace: HistoSpec at its file's commit, the peers from theirs."""
    cells = {}
    for r in find(f"replay_{trace}_peers").rows():
        if r["drafter"] in PEERS:
            cells[(r["drafter"], r["budget"])] = r
    for r in find(f"replay_{trace}_histospec").rows():
        cells[("histospec", r["budget"])] = r
    return cells


def best_peer(cells: dict, budget: int) -> tuple[str, float]:
    return max(((p, cells[(p, budget)]["tau"]) for p in PEERS if (p, budget) in cells), key=lambda x: x[1])


def per_epoch_speedups(run: dict) -> list[float]:
    return [e["tokens_per_s_histospec"] / e["tokens_per_s_plain"] for e in run["per_epoch"]]


def engine_runs() -> list[tuple[str, dict, Result]]:
    """(label, one batch size's bench-engine result, its file) for every engine run of the results page."""
    out = []
    for label, what in (
        ("SmolLM2 arith", "bench_engine_smollm2-arith_b1"),
        ("SmolLM2 arith", "bench_engine_smollm2-arith_b4"),
        ("SmolLM2 units (held out)", "bench_engine_smollm2-units_b4"),
        ("SmolLM2 arith", "bench_engine_smollm2-arith_b16"),
        ("SmolLM2 arith", "bench_engine_smollm2-arith_b64"),
    ):
        res = find(what)
        out.append((label, res.one(), res))
    for label, what in (
        ("tiny, 16 prompts", "bench_engine_tiny-16prompts"),
        ("tiny, 64 prompts", "bench_engine_tiny-64prompts"),
    ):
        res = find(what)
        out += [(label, run, res) for run in res.one()["sweep"]]
    return out


# ---------------------------------------------------------------- tables


def render_drafting(doc: Path) -> str:
    rows, files = [], []
    for trace in SMOLLM2_TRACES:
        cells = smollm2_tau(trace)
        files += [find(f"replay_{trace}_histospec"), find(f"replay_{trace}_peers")]
        for n in (8, 16):
            ours = cells[("histospec", n)]
            peer, peer_tau = best_peer(cells, n)
            name = trace + (" (held out)" if trace in HELD_OUT else "")
            rows.append(
                [
                    name,
                    str(n),
                    f"**{ours['tau']:.2f}**",
                    *(f2(cells[(p, n)]["tau"]) for p in PEERS),
                    ratio(ours["tau"] / peer_tau, DRAFT_TARGET),
                    f2(ours["oracle_tau"]),
                    f"{ours['tau'] / ours['oracle_tau']:.2f}",
                ]
            )
    head = [
        "trace",
        "N",
        "HistoSpec",
        "SGLang NGRAM",
        "suffix",
        "RhymeRL",
        "HistoSpec / best peer (target 1.3x)",
        "oracle",
        "HistoSpec / oracle",
    ]
    cmd = "python scripts/replay_matrix.py docs/data/TRACE.jsonl.gz --budgets 4,8,16,32 --cache OUT.jsonl"
    return table(head, rows) + "\n" + source(files, doc, cmd)


def render_drafting_toy(doc: Path) -> str:
    res = find("replay_demo-grpo-trace_drafters")
    cells = {(r["drafter"], r["budget"]): r for r in res.rows()}
    names = ("histospec", *PEERS, "prompt-lookup")
    rows = []
    for n in sorted({b for _, b in cells}):
        ours = cells[("histospec", n)]
        peer_tau = max(cells[(p, n)]["tau"] for p in PEERS if (p, n) in cells)
        rows.append(
            [
                str(n),
                *(f2(cells.get((d, n), {}).get("tau")) for d in names),
                f2(ours["oracle_tau"]),
                ratio(ours["tau"] / peer_tau, DRAFT_TARGET),
            ]
        )
    head = ["N", "HistoSpec", "SGLang NGRAM", "suffix", "RhymeRL", "prompt lookup", "oracle", "HistoSpec / best peer"]
    return table(head, rows) + "\n" + source([res], doc, "python docs/make_figures.py")


def render_index(doc: Path) -> str:
    res = find("bench_index")
    runs = res.rows()

    def row(label: str, get: Callable[[str], float]) -> list[str]:
        return [
            label,
            f"{get('draft_us_p50'):.1f}",
            f"{get('draft_us_p99'):.0f}",
            f"{get('step_ms_1thread'):.1f}",
            f"{get('step_ms_threads'):.1f}",
            f"{get('ingest_tokens_per_s') / 1e6:.1f}",
            f"{get('bytes_per_token'):.1f}",
            f"{get('tau'):.2f}",
        ]

    rows = [row(f"run {i + 1} (load {r['load_avg_1min']:.1f})", r.get) for i, r in enumerate(runs)]
    med = row("**median**", lambda k: statistics.median(r[k] for r in runs))
    rows.append(med)
    median = {k: statistics.median(r[k] for r in runs) for k in INDEX_TARGETS}
    ok = {
        k: verdict(median[k] >= t if k == "ingest_tokens_per_s" else median[k] <= t) for k, t in INDEX_TARGETS.items()
    }
    rows.append(
        [
            "target",
            f"<= 5: {ok['draft_us_p50']}",
            f"<= 50: {ok['draft_us_p99']}",
            "",
            f"<= 1: {ok['step_ms_threads']}",
            f">= 10: {ok['ingest_tokens_per_s']}",
            f"<= 48: {ok['bytes_per_token']}",
            "",
        ]
    )
    threads = {r["threads"] for r in runs}
    assert len(threads) == 1, f"bench_index runs with different --draft-threads: {sorted(threads)}"
    head = ["run", "draft p50 us", "draft p99 us", "step ms, 1 thread", f"step ms, {threads.pop()} threads"]
    head += ["ingest M tokens / CPU s", "bytes / token", "tau"]
    return (
        table(head, rows) + "\n" + source([res], doc, "OMP_NUM_THREADS=1 histospec bench index --json  # three times")
    )


def render_draft_cost(doc: Path) -> str:
    """``bench draft`` per trace (the median of its runs) beside SGLang NGRAM on the same windows, and the targets."""
    res = find("bench_draft")
    by: dict[str, list[dict]] = {}
    for r in res.rows():
        by.setdefault(r["trace"], []).append(r)

    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    rows, threads = [], {r["draft_threads"] for r in res.rows()}
    assert len(threads) == 1, f"bench_draft runs with different --draft-threads: {sorted(threads)}"
    for trace in sorted(by, key=lambda t: DRAFT_TRACES.index(t) if t in DRAFT_TRACES else len(DRAFT_TRACES)):
        runs = by[trace]
        rows.append([
            f"`{Path(trace).name.removesuffix('.jsonl.gz')}`", f"{med(runs, 'mean_response_tokens'):.0f}",
            f"{med(runs, 'draft_us_p50'):.1f}",
            f"{statistics.median(r['draft_call_us_p99'] / r['draft_call_us_p50'] for r in runs):.2f}",
            f"{med(runs, 'draft_call_us_p50') / 1e3:.1f} / {med(runs, 'draft_call_us_p50_threads') / 1e3:.1f}",
            f"{med(runs, 'extend_us_p50') / 1e3:.2f}", f"{med(runs, 'ngram_batch_get_us_p50_per_request'):.1f}",
            f"{med(runs, 'ratio'):.2f}x", f"{med(runs, 'extend_ratio'):.2f}x", f"{med(runs, 'tau'):.2f}",
            f"{len(runs)} ({min(r['load_avg_1min'] for r in runs):.1f}-{max(r['load_avg_1min'] for r in runs):.1f})",
        ])  # fmt: skip
    head = ["trace", "response tokens", "draft us / request", "call p99 / p50"]
    head += [f"call ms, 1 / {threads.pop()} threads", "extend ms / call", "NGRAM get us / request", "ours / NGRAM get"]
    head += ["extend / NGRAM put", "tau", "runs (load)"]
    cmd = (
        "OMP_NUM_THREADS=1 histospec bench draft TRACE --batch 256 --budget 8 --json  # three times each; "
        f"{SYNTH_CMD.format(n='N', m='2N')}; {SYNTH_MANY_CMD}"
    )
    return table(head, rows) + "\n" + source([res], doc, cmd) + "\n\n" + draft_cost_targets(by)


def draft_cost_targets(by: dict[str, list[dict]]) -> str:
    """One line per target of issue 53 over the long traces (their worst median), met or missed."""
    t = DRAFT_COST_TARGETS
    long = [runs for trace, runs in by.items() if "ledger" in trace or "report" in trace or trace == SYNTH_LONG]
    if not long:
        return ""

    def worst(key: Callable[[list[dict]], float]) -> float:
        return max(key(runs) for runs in long)

    p50 = worst(lambda rs: statistics.median(r["draft_us_p50"] for r in rs))
    tail = worst(lambda rs: statistics.median(r["draft_call_us_p99"] / r["draft_call_us_p50"] for r in rs))
    step = worst(lambda rs: statistics.median(r["draft_call_us_p50_threads"] for r in rs)) / 1e3
    ngram = worst(lambda rs: statistics.median(r["ratio"] for r in rs))
    lines = [
        f"per request p50 {p50:.1f} us (target <= {t['draft_us_p50']:.0f}: {verdict(p50 <= t['draft_us_p50'])})",
        f"call p99 / p50 {tail:.2f} (<= {t['p99_over_p50']:.0f}: {verdict(tail <= t['p99_over_p50'])})",
        f"batch call on 2 threads {step:.1f} ms (<= {t['step_ms_threads']}: {verdict(step <= t['step_ms_threads'])})",
        f"ours / NGRAM batch_get {ngram:.2f}x (<= {t['ratio']}x: {verdict(ngram <= t['ratio'])})",
    ]
    if SYNTH_SHORT in by and SYNTH_LONG in by:
        grow = statistics.median(r["draft_us_p50"] for r in by[SYNTH_LONG]) / statistics.median(
            r["draft_us_p50"] for r in by[SYNTH_SHORT]
        )
        lines.append(f"growth 600 -> 4,096 tokens {grow:.2f}x (<= {t['growth']}x: {verdict(grow <= t['growth'])})")
    return "Worst of the long traces: " + "; ".join(lines) + "."


def _table_name(row: dict) -> str:
    if row["table_file"] == "default":
        return "roofline model"
    return Path(row["table_file"]).name.removeprefix("verify_cost_").split("_20")[0]


def render_projection(doc: Path) -> str:
    """``scripts/projection_matrix.py``'s cells: per trace, table and host speed, HistoSpec adaptive and fixed against
    plain decoding and NGRAM as deployed, the host's share and the tail's, and the aim on the long traces."""
    res = find("projection")
    cells: dict[tuple, dict[str, dict]] = {}
    for r in res.rows():
        cells.setdefault((r["trace"], _table_name(r), r["host_speed"]), {})[r["policy"]] = r
    rows = []
    for (trace, name, speed), by in cells.items():
        a, f = by.get("adaptive"), by.get("fixed")
        if a is None:
            continue
        pa, ng = a["projection"], a["ngram"]
        rows.append([
            f"`{Path(trace).name.removesuffix('.jsonl.gz')}`", name, f"{speed:g}",
            f"{a['tau']:.2f} / {'–' if f is None else format(f['tau'], '.2f')} / {a['ngram_tau']:.2f}",
            f"{pa['speedup']:.2f}x", f"{a['vs_ngram']:.2f}x", "–" if f is None else f"{f['projection']['speedup']:.2f}x",
            f"{ng['speedup']:.2f}x", pct(pa["host_ms"] / pa["ms"]), pct(ng["host_ms"] / ng["ms"]),
            f"{pct(pa['plain_tail_share'])} / {pct(pa['tail_share'])}", f"{a['load_avg_1min']:.1f}",
        ])  # fmt: skip
    head = [
        "trace",
        "table",
        "host x",
        "tau: adaptive / fixed / NGRAM",
        "adaptive / plain",
        "adaptive / NGRAM",
        "fixed / plain",
    ]
    head += ["NGRAM / plain", "host share: ours", "NGRAM", "tail share: plain / ours", "load"]
    cmd = "python scripts/projection_matrix.py --out FILE --tables default,VERIFY_COST_FILE --budget 8"
    return table(head, rows) + "\n" + source([res], doc, cmd) + "\n\n" + projection_aim(res.rows())


def projection_aim(rows: list[dict]) -> str:
    """Issue 54's aim on the long traces, per table at host speed 1 (adaptive), met or missed."""
    t, lines = PROJECTION_TARGETS, []
    for name in dict.fromkeys(_table_name(r) for r in rows):
        long = [r for r in rows if _table_name(r) == name and r["policy"] == "adaptive" and r["host_speed"] == 1.0
                and any(x in r["trace"] for x in LONG_TRACES)]  # fmt: skip
        if not long:
            continue
        plain = min(r["projection"]["speedup"] for r in long)
        ngram = min(r["vs_ngram"] for r in long)
        lines.append(f"{name}: {plain:.2f}x plain (aim >= {t['plain']}x: {verdict(plain >= t['plain'])}), "
                     f"{ngram:.2f}x NGRAM as deployed (aim >= {t['ngram']}x: {verdict(ngram >= t['ngram'])})")  # fmt: skip
    fixed = {Path(r["trace"]).name.removesuffix(".jsonl.gz"): r for r in rows if r["policy"] == "fixed"
             and any(x in r["trace"] for x in LONG_TRACES)}  # fmt: skip
    ceiling = ", ".join(f"`{t}` {r['projection']['plain_rounds'] / r['projection']['rounds']:.2f}x (tau {r['tau']:.2f})"
                        for t, r in fixed.items())  # fmt: skip
    return (
        "Worst of the long traces at host speed 1 (adaptive), a PROJECTION: " + "; ".join(lines) + ". Plain "
        "decoding's rounds over the fixed policy's (its speedup if a verify pass cost a plain one and drafting nothing): "
        + ceiling
        + "."
    )


def render_engine(doc: Path) -> str:
    rows, files = [], []
    for label, run, res in engine_runs():
        files += [res] if res not in files else []
        speed = per_epoch_speedups(run)
        taus = " / ".join(f"{e['tau']:.2f}" for e in run["per_epoch"])
        plain = [e["tokens_per_s_plain"] for e in run["per_epoch"]]
        rows.append(
            [
                label,
                str(run["batch"]),
                " / ".join(ratio(s, ENGINE_FLOOR) for s in speed),
                taus,
                f"{min(plain):.0f}-{max(plain):.0f}",
                aa_range(run),
                f"{run['mean_token_entropy']:.2f}",
            ]
        )
    head = ["run", "batch", "speedup per epoch (0 / 1 / 2)", "tau per epoch", "plain tokens/s", "plain A/A"]
    head += ["entropy (nats)"]
    cmd = (
        "histospec bench engine --model POLICY --task arith --batch 4 --epochs 3 --num-prompts 4 --group-size 4 "
        f"--max-new-tokens 96 --threads 1 --no-hf --json`; tiny: `{TINY_ENGINE} --num-prompts 16"
    )
    return table(head, rows) + "\n" + source(files, doc, cmd)


def aa_range(run: dict) -> str:
    """A second plain engine's tokens/s over the first's, lowest-highest epoch (``--aa``: the timing noise)."""
    lo, hi = run.get("plain_aa_ratio_min"), run.get("plain_aa_ratio_max")
    return "–" if lo is None or hi is None else f"{lo:.2f}-{hi:.2f}"


def render_engine_targets(doc: Path) -> str:
    runs = engine_runs()
    smol = [(lbl, r) for lbl, r, _ in runs if lbl.startswith("SmolLM2") and r["batch"] in (1, 4)]
    last = [per_epoch_speedups(r)[-1] for _, r in smol]
    floor = min(min(per_epoch_speedups(r)) for _, r, _ in runs)
    epochs = [s for _, r, _ in runs for s in per_epoch_speedups(r)]
    below = sum(s < ENGINE_FLOOR for s in epochs)
    gen = find("bench_engine_hf-generate")
    gen_ratios = [r["tokens_per_s_plain"] / r["tokens_per_s_hf_generate"] for r in gen.one()["sweep"]]
    rows = [
        [
            ">= 1.5x at batch 1 and 4 after two epochs of history (SmolLM2)",
            " / ".join(ratio(s) for s in last) + " (arith b1, arith b4, units b4)",
            verdict(min(last) >= ENGINE_TARGET),
        ],
        [
            "never below 0.97x in any epoch, batch 1-64",
            f"lowest {ratio(floor, ENGINE_FLOOR)}; {below} of {len(epochs)} epochs below",
            verdict(below == 0),
        ],
        [
            "plain engine >= 1.3x transformers `generate` (batch 4 / 16)",
            " / ".join(ratio(x) for x in gen_ratios),
            verdict(min(gen_ratios) >= GENERATE_TARGET),
        ],
    ]
    cmd = (
        "histospec bench engine --model POLICY --task arith --batch 4,16 --epochs 2 --num-prompts 4 --group-size 4 "
        "--max-new-tokens 96 --threads 1 --json"
    )
    return table(["target", "measured", "status"], rows) + "\n" + source([gen], doc, cmd)


def demo_runs() -> list[tuple[str, Result]]:
    return [
        (label, find(f"demo_smollm2_{what}"))
        for label, what in (
            ("fresh clone, empty model cache", "fresh-clone"),
            ("second run, cached", "cached"),
            ("`--quick`, cached", "quick"),
        )
    ]


def render_demo(doc: Path) -> str:
    res = find("demo_smollm2_fresh-clone")
    run = res.one()
    rows = [
        [
            str(e["epoch"]),
            f"{e['reward_histospec']:.3f} / {e['reward_plain']:.3f}",
            f"{e['tau']:.2f}",
            f"{e['tokens_per_s_histospec']:.1f}",
            f"{e['tokens_per_s_plain']:.1f}",
            ratio(e["speedup"], ENGINE_FLOOR),
            f"{e['entropy']:.2f}",
        ]
        for e in run["per_epoch"]
    ]
    head = [
        "epoch",
        "reward with / without",
        "tau",
        "tokens/s HistoSpec",
        "tokens/s plain",
        "speedup",
        "entropy (nats)",
    ]
    note = (
        f"\n{run['identical_responses']} of {run['responses']} responses token-identical with and without HistoSpec."
    )
    return table(head, rows) + "\n" + note + "\n" + source([res], doc, "make demo")


def render_demo_runs(doc: Path) -> str:
    rows, files = [], []
    for label, res in demo_runs():
        run = res.one()
        files.append(res)
        secs = round(run["seconds"])
        speed = " / ".join(ratio(e["speedup"], ENGINE_FLOOR) for e in run["per_epoch"])
        taus = " / ".join(f"{e['tau']:.2f}" for e in run["per_epoch"])
        rows.append(
            [
                label,
                f"{secs // 60} min {secs % 60:02d} s",
                speed,
                taus,
                f"{run['identical_responses']} of {run['responses']}",
            ]
        )
    head = ["run", "`histospec demo` wall time", "speedup per epoch", "tau per epoch", "identical responses"]
    return table(head, rows) + "\n" + source(files, doc, "histospec demo [--quick] --json")


PIPE_POLICIES = ("round-robin", "lpt", "histopipe", "histopipe-oracle")


def render_pipe_sim(doc: Path) -> str:
    res = find("pipe_sim_synthetic")
    rows = []
    for workers, cells in res.one()["summary"].items():
        for mode in ("sync", "overlap"):
            for pol in PIPE_POLICIES:
                c = {k.removeprefix(f"{pol}_{mode}_"): v for k, v in cells.items() if k.startswith(f"{pol}_{mode}_")}
                gap = pct(c["warm_gap"]) if mode == "sync" else ""
                name = f"**{pol}**" if pol == "histopipe" else pol
                rows.append([workers, mode, name, f"{c['makespan']:.0f}", gap, pct(c["idle"]), pct(c["steady_idle"])])
    head = ["W", "mode", "policy", "makespan s", "above the bound, steps with history", "idle", "steady idle"]
    cmd = "histospec bench pipe --workers 8,32 --prompts-per-worker 4 --json"
    return table(head, rows) + "\n" + source([res], doc, cmd)


def render_pipe_router(doc: Path) -> str:
    res = find("pipe_sim_router-gate")
    cells = res.one()["summary"]["32"]
    rows = [
        [
            f"**{p}**" if p == "histopipe" else p,
            f"{cells[f'{p}_overlap_makespan']:.0f}",
            pct(cells[f"{p}_overlap_idle"]),
            verdict(cells[f"{p}_overlap_idle"] <= IDLE_TARGET),
        ]
        for p in PIPE_POLICIES
    ]
    cmd = "histospec bench pipe --workers 32 --prompts-per-worker 4 --modes overlap --router-gate --json"
    return table(["policy", "makespan s", "idle", "idle <= 10 %"], rows) + "\n" + source([res], doc, cmd)


def render_pipe_servers(doc: Path) -> str:
    rows, files = [], []
    for mode, what in (("sync", "pipe_servers_sync"), ("overlap", "pipe_servers_overlap")):
        res = find(what)
        files.append(res)
        for r in res.one()["results"]:
            name = f"**{r['policy']}**" if r["policy"] == "histopipe" else r["policy"]
            rows.append([mode, name, f"{r['makespan']:.2f}", pct(r["idle_fraction"]), f"{r['sim_over_measured']:.3f}"])
    head = ["mode", "policy", "makespan s (measured)", "idle (measured)", "simulated / measured"]
    cmd = "histospec bench pipe-servers --steps 12 --json  # and --overlap"
    return table(head, rows) + "\n" + source(files, doc, cmd)


LOCKSTEP_COLUMNS = ("histospec", "NGRAM same corpus", "NGRAM as deployed", "suffix", "rhymerl", "oracle")
LOCKSTEP_EXTRA = ("histospec / oracle", "draft us p50 / p99")
"""Per row, after the tau columns: HistoSpec's share of the oracle and its draft latency per call in the replay."""


def lockstep_column(row: dict) -> str | None:
    """Which column of the lockstep table a replay row fills (None: not shown, e.g. a tuning sweep's row).

    Example: ``{"drafter": "sglang-ngram", "peer_reset": "step"}`` -> ``"NGRAM as deployed"``.
    """
    drafter, reset = row.get("drafter"), row.get("peer_reset")
    if row.get("label", drafter) != drafter and not str(row.get("label")).startswith(f"{drafter}@"):
        return None  # histospec[KEY=VALUE] of scripts/replay_matrix.py --hs
    if drafter == "sglang-ngram":
        return "NGRAM as deployed" if reset == "step" else "NGRAM same corpus"
    if drafter in ("histospec", "suffix", "rhymerl") and reset != "step":
        return drafter
    return None


def lockstep_cells(paths: list[Path]) -> tuple[dict[tuple[str, int], dict[str, float]], set[str]]:
    """{(schedule, budget): {column: tau}} over one trace's files, and the commits their rows name."""
    cells: dict[tuple[str, int], dict[str, float]] = {}
    commits = set()
    for path in paths:
        for row in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
            col = lockstep_column(row)
            if col is None:
                continue
            cell = cells.setdefault((row.get("schedule", "sequential"), row["budget"]), {})
            cell[col] = row["tau"]
            if col == "histospec" and row.get("oracle_tau") is not None:
                cell["oracle"] = row["oracle_tau"]
            if col == "histospec":
                cell["draft_us"] = (row.get("draft_us_p50"), row.get("draft_us_p99"))
            commits.add(str(row.get("commit", "unknown")))
    return cells, commits


def lockstep_tables(results: Path, doc: Path) -> str:
    """One table per trace from ``replay_<trace>_<schedule>.jsonl`` files: tau, rows schedule x budget."""
    by_trace: dict[str, list[Path]] = {}
    for path in sorted(results.iterdir()):
        m = LOCKSTEP.match(path.name)
        if m:
            by_trace.setdefault(m["trace"], []).append(path)
    if not by_trace:
        return "No `replay_<trace>_<schedule>.jsonl` files yet."
    parts = []
    for trace, paths in sorted(by_trace.items()):
        cells, commits = lockstep_cells(paths)
        rows = [[s, str(n), *(f2(c.get(col)) for col in LOCKSTEP_COLUMNS), *_lockstep_extra(c)]
                for (s, n), c in sorted(cells.items())]  # fmt: skip
        files = ", ".join(f"[`{p.name}`]({os.path.relpath(p, doc.parent)})" for p in paths)
        where = f"{files}; commit {', '.join(f'`{c}`' for c in sorted(commits))}; {MACHINE}"
        parts.append(
            f"**{trace}** ({where}):\n\n" + table(["schedule", "N", *LOCKSTEP_COLUMNS, *LOCKSTEP_EXTRA], rows)
        )
    return "\n\n".join(parts)


def _lockstep_extra(cell: dict) -> list[str]:
    """HistoSpec / oracle and its draft latency (p50 / p99 us per call) for one table row; "-" where absent."""
    ours, oracle = cell.get("histospec"), cell.get("oracle")
    share = f"{ours / oracle:.2f}" if ours and oracle else "–"
    p50, p99 = cell.get("draft_us", (None, None))
    return [share, f"{p50:.0f} / {p99:.0f}" if p50 is not None and p99 is not None else "–"]


RANKING_VARIANTS = ("bins", "bins + share", "re-ranker")
"""The anchor scorer's node scoring, in the order measured: the (depth, raw, best) recalibration bins, the same with
a fourth class (the node's share of its parent's anchors), and the logistic re-ranker (the default)."""


def render_ranking(doc: Path) -> str:
    """Lockstep tau of each node-scoring variant per trace and budget, and its ratio to the bins."""
    res = find("replay_smollm2_ranking")
    cells: dict[tuple[str, int], dict[str, dict]] = {}
    for r in res.rows():
        trace = Path(r["trace"]).name.removesuffix(".jsonl.gz")
        cells.setdefault((trace, r["budget"]), {})[r["variant"]] = r
    rows, commits = [], {}
    for (trace, n), by in sorted(cells.items()):
        base = by["bins"]["tau"]
        row = [trace + (" (held out)" if trace in HELD_OUT else ""), str(n), f2(base)]
        for v in RANKING_VARIANTS[1:]:
            row.append(f"{f2(by[v]['tau'])} ({ratio(by[v]['tau'] / base)})" if v in by else "–")
        rows.append(row)
        commits.update({v: by[v]["commit"] for v in by})
    head = ["trace", "N", *(f"{v} (`{commits.get(v, '?')}`)" for v in RANKING_VARIANTS)]
    cmd = (
        "python scripts/replay_matrix.py docs/data/TRACE.jsonl.gz --drafters histospec --budgets 8,16 "
        "--schedule lockstep --no-oracle --cache OUT.jsonl"
    )
    return table(head, rows) + "\n" + source([res], doc, cmd)


def render_lockstep(doc: Path) -> str:
    return lockstep_tables(RESULTS, doc)


def lockstep_ratios(trace: str) -> str | None:
    """``1.20x / 1.25x; 2.09x / 2.46x``: HistoSpec's tau over the best same-corpus peer, then over NGRAM as
    deployed, at N = 8 / 16 in lockstep; None without the trace's lockstep file."""
    path = RESULTS / f"replay_{trace}_lockstep.jsonl"
    if not path.is_file():
        return None
    cells, _ = lockstep_cells([path])
    peers = ("NGRAM same corpus", "suffix", "rhymerl")
    if any("histospec" not in cells.get(("lockstep", n), {}) for n in (8, 16)):
        return None  # HistoSpec not replayed on this trace yet
    best = [cells[("lockstep", n)]["histospec"] / max(cells[("lockstep", n)][c] for c in peers) for n in (8, 16)]
    deployed = [cells[("lockstep", n)]["histospec"] / cells[("lockstep", n)]["NGRAM as deployed"] for n in (8, 16)]
    return (
        " / ".join(ratio(x, DRAFT_TARGET) for x in best)
        + "; "
        + " / ".join(ratio(x, DEPLOYED_TARGET) for x in deployed)
    )


def readme_drafting_rows() -> list[list[str]]:
    rows = []
    for t in SMOLLM2_TRACES + LONG_TRACES:
        measured = lockstep_ratios(t)
        if measured is not None:
            workload = f"`{t}` lockstep replay" + (", held out" if t in HELD_OUT else "")
            rows.append(["tau vs best peer; vs NGRAM as deployed, N = 8 / 16", workload, measured, "1.3x; 1.5x",
                         "lockstep-replay"])  # fmt: skip
    runs = find("bench_draft").rows()
    t = DRAFT_COST_TARGETS
    real = [x for x in DRAFT_TRACES[:2] if any(r["trace"] == x for r in runs)]

    def med(trace: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["trace"] == trace)

    workload = " / ".join(f"`{Path(x).name.removesuffix('.jsonl.gz')}`" for x in real) + ", batch 256"
    p50, vs = [med(x, "draft_us_p50") for x in real], [med(x, "ratio") for x in real]
    cell = " / ".join(f"{v:.0f}" for v in p50) + " us; " + " / ".join(f"{v:.2f}x" for v in vs)
    target = f"10 us; 0.5x: {verdict(max(p50) <= t['draft_us_p50'])}; {verdict(max(vs) <= t['ratio'])}"
    rows.append(["draft cost per request; vs NGRAM's batch_get", workload, cell, target, "draft-cost"])
    step = [med(x, "draft_call_us_p50_threads") / 1e3 for x in real]
    threads = runs[0]["draft_threads"]
    cell = " / ".join(f"{v:.1f}" for v in step) + " ms"
    rows.append([f"draft step, {threads} threads", workload, cell,
                 f"1.5 ms: {verdict(max(step) <= t['step_ms_threads'])}", "draft-cost"])  # fmt: skip
    return rows


def readme_engine_rows() -> list[list[str]]:
    """The engine's two targets (issue 13): the SmolLM2 speedup after two epochs of history at batch 1 and 4, and
    the lowest epoch over every run, batch 1-64."""
    runs = engine_runs()
    smol = [r for lbl, r, _ in runs if lbl.startswith("SmolLM2") and r["batch"] in (1, 4)]
    last = " / ".join(ratio(per_epoch_speedups(r)[-1], ENGINE_TARGET) for r in smol)
    epochs = [s for _, r, _ in runs for s in per_epoch_speedups(r)]
    below = sum(s < ENGINE_FLOOR for s in epochs)
    return [
        ["engine speedup, third epoch", "`bench engine` SmolLM2, batch 1 / 4 / 4 held out", last, "1.5x", "engine"],
        [
            "engine, lowest epoch",
            "`bench engine` SmolLM2 and tiny, batch 1-64",
            f"{ratio(min(epochs), ENGINE_FLOOR)}; {below} of {len(epochs)} epochs below",
            "0.97x",
            "engine",
        ],
    ]


def readme_demo_rows() -> list[list[str]]:
    """The demo's speedup per epoch."""
    epochs = find("demo_smollm2_fresh-clone").one()["per_epoch"]
    speeds = " / ".join(ratio(e["speedup"], ENGINE_FLOOR) for e in epochs)
    workload = f"`make demo` (arith), 4 x 4 requests, {statistics.mean(e['entropy'] for e in epochs):.2f} nats"
    return [["rollout speedup per epoch", workload, speeds, "0.97x", "demo"]]


def readme_pipe_rows() -> list[list[str]]:
    sim = find("pipe_sim_synthetic").one()["summary"]["32"]["histopipe_overlap_idle"]
    gate = find("pipe_sim_router-gate").one()["summary"]["32"]["histopipe_overlap_idle"]
    target = f"10 %: {verdict(sim <= IDLE_TARGET)} / {verdict(gate <= IDLE_TARGET)}"
    workload = "simulated: pipeline / router's rule"
    return [["idle, one-step overlap, W = 32", workload, f"{pct(sim)} / {pct(gate)}", target, "histopipe"]]


def readme_projection_rows() -> list[list[str]]:
    """Projected rollout time on the long traces, per table, at host speed 1 (adaptive): vs plain; vs NGRAM."""
    rows, runs = [], find("projection").rows()
    for name in dict.fromkeys(_table_name(r) for r in runs):
        cells = [r for t in LONG_TRACES for r in runs if t in r["trace"] and _table_name(r) == name
                 and r["policy"] == "adaptive" and r["host_speed"] == 1.0]  # fmt: skip
        if not cells:
            continue
        plain = " / ".join(ratio(r["projection"]["speedup"], PROJECTION_TARGETS["plain"]) for r in cells)
        ngram = " / ".join(ratio(r["vs_ngram"], PROJECTION_TARGETS["ngram"]) for r in cells)
        workload = f"PROJECTION, {name}: " + " / ".join(f"`{t}`" for t in LONG_TRACES)
        target = f"{PROJECTION_TARGETS['plain']}x; {PROJECTION_TARGETS['ngram']}x"
        rows.append(["rollout time vs plain; vs NGRAM as deployed", workload, f"{plain}; {ngram}", target,
                     "projected-rollout-time"])  # fmt: skip
    return rows


def readme_rows() -> list[list[str]]:
    """The README's results table: one short row per headline figure, the last cell a link to its section."""
    rows = [*readme_drafting_rows(), *readme_projection_rows(), *readme_engine_rows(), *readme_demo_rows(),
            *readme_pipe_rows()]  # fmt: skip
    return [[*r[:-1], f"[{r[-1]}](docs/results.md#{r[-1]})"] for r in rows]


def render_readme(doc: Path) -> str:
    head = ["figure", "workload", "measured", "target", "details"]
    return table(head, readme_rows())


RENDERERS: dict[str, Callable[[Path], str]] = {
    "readme": render_readme,
    "drafting": render_drafting,
    "drafting-toy": render_drafting_toy,
    "index": render_index,
    "draft-cost": render_draft_cost,
    "projection": render_projection,
    "engine": render_engine,
    "engine-targets": render_engine_targets,
    "demo": render_demo,
    "demo-runs": render_demo_runs,
    "pipe-sim": render_pipe_sim,
    "pipe-router": render_pipe_router,
    "pipe-servers": render_pipe_servers,
    "lockstep": render_lockstep,
    "ranking": render_ranking,
}


def render_text(text: str, doc: Path) -> str:
    """``text`` with every ``<!-- results:NAME -->`` block re-rendered; ValueError for an unknown NAME."""

    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in RENDERERS:
            raise ValueError(f"{doc.name}: unknown results block {name!r}; known: {sorted(RENDERERS)}")
        return f"<!-- results:{name} -->\n{RENDERERS[name](doc)}\n<!-- /results:{name} -->"

    return MARKER.sub(fill, text)


def render_files(check: bool) -> list[Path]:
    """Rewrite (or with ``check`` only compare) README.md and docs/results.md; the files that were stale."""
    stale = []
    for doc in DOCS:
        old = doc.read_text()
        new = render_text(old, doc)
        if new != old:
            stale.append(doc)
            if not check:
                doc.write_text(new)
    return stale


# ---------------------------------------------------------------- make results-run


@dataclass(frozen=True)
class Run:
    """One headline benchmark of ``make results-run``: the command, and the result file it refreshes."""

    what: str
    command: str
    minutes: float
    ext: str = "json"


SMOLLM2_POLICY = "smollm2-135m-instruct-{family}-*"
ENGINE_ARGS = "--epochs 3 --group-size 4 --max-new-tokens 96 --threads 1 --no-hf --json"
TINY_ENGINE = (
    "histospec bench engine --quick-model --batch 1,4,16,64 --group-size 8 --epochs 3 --threads 1 --no-hf --aa --json"
)
RUNS = (
    *(
        Run(
            f"replay_{t}_histospec",
            f"python scripts/replay_matrix.py docs/data/{t}.jsonl.gz --drafters histospec --schedule sequential --cache {{out}}",
            2,
            "jsonl",
        )
        for t in SMOLLM2_TRACES
    ),
    Run("replay_demo-grpo-trace_drafters", "python docs/make_figures.py --json-out {out}", 2),
    Run(
        "bench_index",
        "for i in 1 2 3; do OMP_NUM_THREADS=1 histospec bench index --json | tail -1 >> {out}; done",
        6,
        "jsonl",
    ),
    Run(
        "bench_draft",
        " && ".join([*(SYNTH_CMD.format(n=n, m=2 * n) for n in (600, 4096)), SYNTH_MANY_CMD])
        + " && for i in 1 2 3; do for t in "
        + " ".join(DRAFT_TRACES)
        + "; do OMP_NUM_THREADS=1 histospec bench draft $t --batch 256 --budget 8 --json | tail -1 >> {out}; done; done",
        15,
        "jsonl",
    ),
    Run(
        "projection",
        "python scripts/projection_matrix.py --out {out} --budget 8 --tables "
        "default,$(ls docs/data/results/verify_cost_*.json | paste -sd,)",  # a committed GPU table joins by itself
        25,
        "jsonl",
    ),
    Run(
        "pipe_sim_synthetic", "histospec bench pipe --workers 8,32 --prompts-per-worker 4 --json | tail -1 > {out}", 1
    ),
    Run(
        "pipe_sim_router-gate",
        "histospec bench pipe --workers 32 --prompts-per-worker 4 --modes overlap --router-gate --json | tail -1 > {out}",
        1,
    ),
    Run(
        "bench_engine_smollm2-arith_b1",
        f"histospec bench engine --model {{policy_arith}} --task arith --batch 1 "
        f"--num-prompts 2 {ENGINE_ARGS} | tail -1 > {{out}}",
        5,
    ),
    Run(
        "bench_engine_smollm2-arith_b4",
        f"histospec bench engine --model {{policy_arith}} --task arith --batch 4 "
        f"--num-prompts 4 {ENGINE_ARGS} | tail -1 > {{out}}",
        5,
    ),
    Run(
        "bench_engine_smollm2-units_b4",
        f"histospec bench engine --model {{policy_units}} --task units --batch 4 "
        f"--num-prompts 4 {ENGINE_ARGS} | tail -1 > {{out}}",
        5,
    ),
    *(
        Run(
            f"bench_engine_smollm2-arith_b{batch}",
            f"histospec bench engine --model {{policy_arith}} --task arith --batch {batch} "
            f"--num-prompts {prompts} {ENGINE_ARGS} | tail -1 > {{out}}",
            minutes,
        )
        for batch, prompts, minutes in ((16, 4, 6), (64, 16, 12))
    ),
    *(
        Run(f"bench_engine_tiny-{n}prompts", f"{TINY_ENGINE} --num-prompts {n} | tail -1 > {{out}}", minutes)
        for n, minutes in ((16, 4), (64, 12))
    ),
)
"""What ``--run`` reruns, about 70 minutes on the 2-vCPU VM; the demo (30+ CPU minutes) is run by hand."""


def policy_dir(family: str) -> str:
    """The warm-up policy ``histospec demo`` cached for ``family``; ValueError naming the fix when there is none."""
    cache = Path(os.environ.get("HISTOSPEC_CACHE_DIR", Path.home() / ".cache" / "sglang-histospec"))
    found = sorted((cache / "demo-policies").glob(SMOLLM2_POLICY.format(family=family)))
    if not found:
        raise ValueError(
            f"no cached {family} policy under {cache / 'demo-policies'}; run `histospec demo "
            f"--family {family}` once (it caches the warm-up policy)"
        )
    return str(found[-1])


def run_all(dry_run: bool, only: set[str] | None = None) -> int:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    day = date.today().isoformat()
    print(f"# {len(RUNS)} runs, about {sum(r.minutes for r in RUNS):.0f} minutes; results at commit {commit}")
    for run in RUNS:
        if only and run.what not in only:
            continue
        out = RESULTS / f"{run.what}_{day}_{commit}.{run.ext}"
        fields = {"out": os.path.relpath(out, REPO)}
        if "{policy_" in run.command:
            fields.update(policy_arith="POLICY_ARITH", policy_units="POLICY_UNITS") if dry_run else fields.update(
                policy_arith=policy_dir("arith"), policy_units=policy_dir("units")
            )
        cmd = run.command.format(**fields)
        print(f"{run.what} (~{run.minutes:g} min): {cmd}")
        if dry_run:
            continue
        out.unlink(missing_ok=True)
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # python, histospec
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PATH": path}
        subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, env=env, check=True)
        for old in RESULTS.iterdir():
            m = NAME.match(old.name)
            if m and m["what"] == run.what and old != out:
                old.unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is stale")
    ap.add_argument("--run", action="store_true", help="rerun the headline benchmarks first (about 70 minutes)")
    ap.add_argument("--dry-run", action="store_true", help="with --run: list the commands, run nothing")
    ap.add_argument("--only", default=None, help="with --run: these results only (comma-separated names)")
    args = ap.parse_args(argv)
    if args.run:
        only = set(args.only.split(",")) if args.only else None
        unknown = (only or set()) - {r.what for r in RUNS}
        if unknown:
            raise ValueError(f"--only {sorted(unknown)}: not rerun by --run; choose from {[r.what for r in RUNS]}")
        run_all(args.dry_run, only)
        if args.dry_run:
            return 0
    stale = render_files(check=args.check)
    for doc in stale:
        print(f"{os.path.relpath(doc, REPO)}: {'stale; run `make results`' if args.check else 'rewritten'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
