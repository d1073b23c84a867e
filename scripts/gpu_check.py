"""One command that measures the embedded engine on a lent GPU; its CPU path (``--device cpu --sizes tiny``) is CI's.

Writes one JSON file (``--out``; rewritten after every section and cell, so a run cut off keeps what it finished)
and prints a short table. Sections:

- ``env``: interpreter, torch, the device, and the drafter's backend (the Python reference when the native extension
  is not built for this interpreter).
- ``greedy``: the tiny model's greedy tokens with and without HistoSpec, token for token (``draft_selection="always"``;
  the second round drafts from the first round's responses, now history).
- ``gpu_tests``: the test files carrying the ``gpu`` marker, run by pytest in a subprocess; outcome per test.
- ``forward``: milliseconds of one verify pass (the engine's ``TreeForward`` + logits + softmax, timed by
  ``engine/verify_table.py`` as ``histospec bench verify-cost`` times it) against verify rows per request, per model
  size (``models/shapes.py``, random weights) and batch; medians of ``--repeats`` synchronised passes after a
  warm-up. A cell that would not fit in free memory, or in what is left of ``--time-budget-s``, is skipped with its
  reason. Each size's cells are also written as a ``--verify-cost`` table, ``verify_cost_<device>_<size>.json``
  beside ``--out`` (``histospec replay --verify-cost FILE`` projects rollout time on it).
- ``projection``: speedup ~ tau x t(1 row) / t(1+N rows) for the replayed tau of every committed trace at draft
  budget N (``docs/data/results/replay_*_histospec_*.jsonl``): a projection, not a measurement (drafting time and the cost
  cut left out; t at 1+N rows interpolated between measured rows, ``tk_from`` says which).

Example (from the repository root; the package is imported from the tree)::

    python3 scripts/gpu_check.py                      # cuda, bfloat16, sizes 0.5b,1.5b,8b -> gpu_check.json
    python3 scripts/gpu_check.py --device cpu --sizes tiny --out build/gpu_check_cpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python3 scripts/gpu_check.py` imports the package from this tree
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams  # noqa: E402
from sglang_histospec.engine.engine import Engine  # noqa: E402
from sglang_histospec.engine.model import TreeForward  # noqa: E402
from sglang_histospec.engine.verify_table import (  # noqa: E402
    BATCHES,
    MEMORY_HEADROOM,
    ROWS,
    Deadline,
    VerifyTimingConfig,
    free_bytes,
    save_table,
    time_cells,
)
from sglang_histospec.models.shapes import SHAPES, parameter_count, random_model  # noqa: E402

SIZES = ("0.5b", "1.5b", "8b")
REPLAYS = "docs/data/results/replay_*_histospec_*.jsonl"
"""Exact replays of the default drafter of the committed traces (docs/results.md, drafting quality)."""
TRACES = "docs/data/*.jsonl.gz"
MIN_SIZE_S = 60
"""A model size starts only with this many seconds of the budget left (building an 8B model takes some of them)."""
EXTRAPOLATE = 0.125
"""The projection extrapolates a pass's time at most this share past the largest measured rows (32 -> 33 rows)."""
GREEDY_PROMPTS, GREEDY_NEW_TOKENS = 16, 32
PROJECTION_LABEL = (
    "PROJECTION, not a measurement: speedup ~ tau x t(1 row) / t(1+N rows) per request at batch B, tau from the "
    "exact offline replay at draft budget N; drafting time and the cost-aware cut left out"
)


@dataclass(slots=True)
class CheckConfig:
    """What ``gpu_check.py`` measures; every field is a command-line flag of the same name."""

    device: str = "cuda"
    dtype: str = "auto"
    """"auto" = bfloat16 on CUDA, float32 on CPU."""
    sizes: list[str] = field(default_factory=lambda: list(SIZES))
    batches: list[int] = field(default_factory=lambda: list(BATCHES))
    rows: list[int] = field(default_factory=lambda: list(ROWS))
    """Verify rows per request (the root plus the draft nodes)."""
    context: int = 512
    """Cached tokens every request attends to (prompt and response so far)."""
    repeats: int = 5
    """Timed passes per cell; the cell's figure is their median."""
    warmup: int = 1
    """Untimed passes before them."""
    time_budget_s: float = 420.0
    """Cells (and model sizes) that would end past this many seconds from the start are skipped."""
    pytest_timeout_s: float = 150.0
    """The gpu-marked tests are stopped after this long (or a third of the budget left, if less)."""
    run_tests: bool = True
    out: str = "gpu_check.json"
    """The JSON file written."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device {self.device!r}; use cpu, cuda or cuda:N")
        if self.device != "cpu" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device} but torch sees no CUDA device; use --device cpu --sizes tiny")
        if self.dtype == "auto":
            self.dtype = "float32" if self.device == "cpu" else "bfloat16"
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype {self.dtype!r}; use auto, float32, bfloat16 or float16")
        bad = [s for s in self.sizes if s not in SHAPES]
        if bad:
            raise ValueError(f"--sizes {','.join(bad)} unknown; use some of {','.join(SHAPES)}")
        if min(self.batches + self.rows) < 1 or self.context < 0 or self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"--batches {self.batches} --rows {self.rows} --context {self.context} --repeats {self.repeats} "
                f"--warmup {self.warmup}: batches and rows need ints >= 1, context >= 0, repeats >= 1, warmup >= 0"
            )


class Report:
    """The JSON result, written whole to ``path`` after every change."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.data: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")


def guarded(fn, *args, label: dict | None = None):
    """``fn(*args)``, or where it raises ``{**label, "error", "traceback"}``: one broken part of the engine on a
    new device must not cost the other sections their run. Example: ``guarded(int, "x")["error"]`` starts with
    ``"ValueError: invalid literal"``."""
    try:
        return fn(*args)
    except Exception as exc:  # recorded in the JSON, not hidden
        lines = traceback.format_exc().strip().splitlines()
        failure = {**(label or {}), "error": f"{type(exc).__name__}: {exc}"[:500], "traceback": lines[-8:]}
    gc.collect()  # after the except block: the traceback's frames no longer hold the failed part's tensors
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return failure


# ---------------------------------------------------------------------------------------------------- environment
def environment(cfg: CheckConfig) -> dict:
    """Interpreter, libraries, device, and which drafter backend the engine gets here."""
    import transformers

    from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    env["drafter_backend"] = HistoSpecDrafter(DrafterConfig()).backend
    if env["drafter_backend"] != "native":
        env["drafter_note"] = "native extension not built for this interpreter: the Python reference drafts"
    env["commit"] = _git_commit()
    if cfg.device == "cpu":
        return {**env, "device": "cpu", "threads": torch.get_num_threads()}
    props = torch.cuda.get_device_properties(cfg.device)
    return {**env, "device": props.name, "cuda": torch.version.cuda, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1)}  # fmt: skip


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


# ---------------------------------------------------------------------------------------------------- greedy
def greedy_identity(cfg: CheckConfig) -> list[dict]:
    """Per dtype (the run's, and float32 on CUDA too): HistoSpec's greedy tokens against plain decoding's."""
    dtypes = list(dict.fromkeys([cfg.dtype, "float32"]))
    with tempfile.TemporaryDirectory() as tmp:
        random_model("tiny", seed=3).save_pretrained(tmp)
        return [guarded(_greedy_one, tmp, cfg.device, dtype, label={"dtype": dtype}) for dtype in dtypes]


def _greedy_requests(tag: str) -> list[GenerateRequest]:
    rng = np.random.default_rng(0)
    vocab = SHAPES["tiny"].vocab_size
    params = SamplingParams(temperature=0.0, max_new_tokens=GREEDY_NEW_TOKENS, ignore_eos=True)
    return [
        GenerateRequest(f"{tag}{i}", [1, *rng.integers(4, vocab, size=int(rng.integers(3, 12))).tolist()],
                        sampling=params, prompt_id=f"p{i}")
        for i in range(GREEDY_PROMPTS)
    ]  # fmt: skip


def _greedy_one(model_dir: str, device: str, dtype: str) -> dict:
    common = dict(model_path=model_dir, device=device, dtype=dtype, max_running_requests=GREEDY_PROMPTS)
    plain = Engine(EngineConfig(**common, speculative_algorithm="NONE")).generate(_greedy_requests("plain"))
    reference = [r.output_ids for r in plain]
    spec = Engine(EngineConfig(**common, speculative_algorithm="HISTOSPEC", draft_selection="always"))
    rounds = []
    for step in range(2):  # round 1 drafts from round 0's responses (history after end_step)
        rounds.append(_greedy_round(spec.generate(_greedy_requests(f"r{step}-")), reference))
        spec.drafter.end_step(step)
    identical = all(r["identical"] == r["requests"] for r in rounds)
    return {"dtype": dtype, "identical": identical, "drafter_backend": spec.drafter.backend, "rounds": rounds}


def _greedy_round(results, reference: list[list[int]]) -> dict:
    same = [r.output_ids == ref for r, ref in zip(results, reference)]
    steps = sum(r.spec_verify_ct for r in results)
    out = {"requests": len(results), "identical": sum(same), "tau": sum(r.completion_tokens for r in results) / steps,
           "drafted": sum(r.spec_draft_tokens for r in results),
           "accepted": sum(r.spec_accepted_tokens for r in results)}  # fmt: skip
    if not all(same):
        i = same.index(False)
        got, ref = results[i].output_ids, reference[i]
        out["first_mismatch"] = {"request": i, "position": next(j for j, (a, b) in enumerate(zip(got, ref)) if a != b)}
    return out


# ---------------------------------------------------------------------------------------------------- gpu tests
def gpu_test_files() -> list[str]:
    """Test files that carry the ``gpu`` marker (a text search: importing them may need what is missing here)."""
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in files if "pytest.mark.gpu" in p.read_text()]


def run_gpu_tests(cfg: CheckConfig, deadline: Deadline) -> dict:
    """Pytest on ``gpu_test_files()`` with ``-m gpu``; ``{"returncode", "tests": [{"id", "outcome", "message"}]}``."""
    files = gpu_test_files()
    timeout = max(10.0, min(cfg.pytest_timeout_s, deadline.left() / 3))
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", f"--junitxml={xml}", *files]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"files": files, "returncode": None, "error": f"pytest ran past {timeout:.0f} s and was stopped"}
        tests = _junit_outcomes(xml) if xml.is_file() else []
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return {"files": files, "returncode": proc.returncode, "seconds": round(time.monotonic() - started, 1),
            "tests": tests, "summary": tail}  # fmt: skip


def _junit_outcomes(path: Path) -> list[dict]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "")[:300]
        test_id = "::".join(filter(None, (case.get("classname"), case.get("name"))))
        out.append({"id": test_id, "outcome": outcome, "message": message})
    return out


# ---------------------------------------------------------------------------------------------------- forward
def time_forward(cfg: CheckConfig, size: str, deadline: Deadline, report: Report) -> dict:
    """Every (batch, rows) cell of one model size into ``report.data["forward"][size]``, saved after each cell
    (``engine/verify_table.py``, as ``histospec bench verify-cost`` measures them), then the size's table in the
    ``--verify-cost`` format beside ``--out`` (``verify_cost_file``)."""
    elt = getattr(torch, cfg.dtype).itemsize
    result = report.data["forward"][size] = {"parameters": parameter_count(size), "cells": []}
    reason = _size_skip_reason(cfg, parameter_count(size) * elt, deadline)
    if reason:
        result["skipped"] = reason
        return result
    started = time.monotonic()
    fwd = TreeForward(random_model(size, device=cfg.device, dtype=cfg.dtype))
    _sync(cfg.device)
    result["build_s"] = round(time.monotonic() - started, 1)

    def saved(cells: list[dict]) -> None:
        result["cells"] = cells
        report.save()

    timing = VerifyTimingConfig(cfg.batches, cfg.rows, cfg.context, cfg.repeats, cfg.warmup)
    cells = time_cells(fwd, timing, deadline, on_cell=saved)
    if any(c["status"] == "ok" for c in cells):
        result["verify_cost_file"] = _write_table(cfg, size, cells)
    del fwd
    gc.collect()
    if cfg.device != "cpu":
        torch.cuda.empty_cache()
    return result


def _write_table(cfg: CheckConfig, size: str, cells: list[dict]) -> str:
    """The measured cells as a ``--verify-cost`` file ``verify_cost_<device>_<size>.json`` beside ``--out``."""
    device = torch.cuda.get_device_name(cfg.device) if cfg.device != "cpu" else "cpu"
    meta = {"model": f"shape {size}", "dtype": cfg.dtype, "device": device, "context": cfg.context,
            "repeats": cfg.repeats, "warmup": cfg.warmup, "commit": _git_commit(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "source": "scripts/gpu_check.py"}  # fmt: skip
    path = Path(cfg.out).with_name(f"verify_cost_{cfg.device.replace(':', '')}_{size}.json")
    save_table(path, cells, meta)
    return str(path)


def _size_skip_reason(cfg: CheckConfig, weights: int, deadline: Deadline) -> str | None:
    free = free_bytes(cfg.device)
    if weights > MEMORY_HEADROOM * free:
        return f"weights {weights / 2**30:.1f} GiB > {MEMORY_HEADROOM} x free {free / 2**30:.1f} GiB"
    if deadline.left() < MIN_SIZE_S:
        return f"time budget: {max(0, deadline.left()):.0f} s left, {MIN_SIZE_S} s needed to build and time a model"
    return None


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------------- projection
def replayed_tau() -> dict[str, dict]:
    """``{trace: {"file", "tau": {budget: tau}}}`` of the histospec rows of ``REPLAYS``."""
    out: dict[str, dict] = {}
    for path in sorted(ROOT.glob(REPLAYS)):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("label") == "histospec":
                entry = out.setdefault(row["trace"], {"file": str(path.relative_to(ROOT)), "tau": {}})
                entry["tau"][int(row["budget"])] = float(row["tau"])
    return out


def interpolate(points: dict[int, float], rows: int) -> float | None:
    """Pass time at ``rows`` rows: linear between the measured rows, and along the last segment up to
    ``EXTRAPOLATE`` past the last measured rows (None further out, or below the first).

    Example: ``interpolate({1: 1.0, 2: 1.5, 4: 2.5}, 3)`` is 2.0; ``interpolate({4: 2.5, 8: 4.5}, 9)`` is 5.0.
    """
    xs = sorted(points)
    if len(xs) < 2 or not xs[0] <= rows <= xs[-1] * (1 + EXTRAPOLATE):
        return points.get(rows)
    right = next((i for i, x in enumerate(xs) if x >= rows), len(xs) - 1)
    lo, hi = xs[max(right - 1, 0)], xs[max(right, 1)]
    return points[lo] + (points[hi] - points[lo]) * (rows - lo) / (hi - lo)


def projection(forward: dict, taus: dict[str, dict]) -> dict:
    """Projected speedups for every committed trace, size, batch and replayed budget; traces without a replay
    are listed with ``tau: null``."""
    rows_out = []
    for trace in sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(TRACES)):
        if trace not in taus:
            rows_out.append({"trace": trace, "tau": None, "note": f"no histospec row in {REPLAYS}"})
            continue
        for size, result in forward.items():
            for batch, points in _points_by_batch(result).items():
                rows_out += _project_batch(trace, taus[trace], size, batch, points)
    return {"label": PROJECTION_LABEL, "replays": REPLAYS, "rows": rows_out}


def _points_by_batch(result: dict) -> dict[int, dict[int, float]]:
    by_batch: dict[int, dict[int, float]] = {}
    for cell in result.get("cells", []):
        if cell["status"] == "ok":
            by_batch.setdefault(cell["batch"], {})[cell["rows"]] = cell["median_ms"]
    return by_batch


def _project_batch(trace: str, replay: dict, size: str, batch: int, points: dict[int, float]) -> list[dict]:
    out = []
    for budget, tau in sorted(replay["tau"].items()):
        t1, tk = points.get(1), interpolate(points, budget + 1)
        tk = None if tk is None else round(tk, 4)  # the speedup is computed from the figures the JSON reports
        speedup = None if t1 is None or tk is None else round(tau * t1 / tk, 3)
        out.append({"trace": trace, "replay_file": replay["file"], "size": size, "batch": batch, "budget": budget,
                    "tau": tau, "t1_ms": t1, "tk_ms": tk,
                    "tk_from": _source(points, budget + 1), "projected_speedup": speedup})  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------------- output
def table(data: dict) -> str:
    """The short text summary printed at the end."""
    env = data["env"]
    lines = [f"gpu_check on {env['device']} ({data['config']['dtype']}), torch {env['torch']}, "
             f"drafter {env['drafter_backend']}"]  # fmt: skip
    greedy = data.get("greedy", [])
    for g in [greedy] if isinstance(greedy, dict) else greedy:
        lines.append(_greedy_line(g))
    tests = data.get("gpu_tests", {})
    for t in tests.get("tests", []):
        lines.append(f"gpu test {t['outcome']:7s} {t['id']}  {t['message'][:80]}")
    if "error" in tests:
        lines.append(f"gpu tests: {tests['error']}")
    lines += _forward_lines(data.get("forward", {}), data["config"]["rows"])
    lines += _projection_lines(data.get("projection", {}))
    return "\n".join(lines)


def _greedy_line(g: dict) -> str:
    if "error" in g:
        return f"greedy identity {g.get('dtype', '')}: ERROR {g['error'][:200]}"
    rounds = ", ".join(f"{r['identical']}/{r['requests']} tau {r['tau']:.2f}" for r in g["rounds"])
    return f"greedy identity {g['dtype']}: {'IDENTICAL' if g['identical'] else 'DIFFERS'} ({rounds})"


def _forward_lines(forward: dict, rows: list[int]) -> list[str]:
    lines = ["verify pass ms (rows per request ->)", "size  batch " + "".join(f"{r:>9d}" for r in rows)]
    for size, result in forward.items():
        for key in ("skipped", "error"):
            if key in result:
                lines.append(f"{size:5s} {key}: {result[key][:200]}")
        by_cell = {(c["batch"], c["rows"]): c for c in result.get("cells", [])}
        for batch in sorted({b for b, _ in by_cell}):
            cells = [by_cell.get((batch, r), {"status": "-"}) for r in rows]
            text = "".join(f"{c['median_ms']:9.2f}" if c["status"] == "ok" else f"{c['status']:>9s}" for c in cells)
            lines.append(f"{size:5s} {batch:5d} {text}")
    return lines


def _projection_lines(proj: dict) -> list[str]:
    """One line per trace and size: the best projected speedup (and its budget N) at every batch."""
    best: dict[tuple, dict[int, dict]] = {}
    for row in proj.get("rows", []):
        if row.get("projected_speedup") is not None:
            per_batch = best.setdefault((Path(row["trace"]).name, row["size"]), {})
            kept = per_batch.get(row["batch"], row)
            per_batch[row["batch"]] = max(kept, row, key=lambda r: r["projected_speedup"])
    batches = sorted({b for per_batch in best.values() for b in per_batch})
    lines = [proj.get("label", ""), "best x speedup (N) per batch:".ljust(46) + "".join(f"{b:>12d}" for b in batches)]
    for (trace, size), per_batch in sorted(best.items()):
        text = "".join(f"{_best_cell(per_batch.get(b)):>12s}" for b in batches)
        lines.append(f"  {trace:38s} {size:5s}{text}")
    return lines


def _source(points: dict[int, float], rows: int) -> str:
    if rows in points:
        return "measured"
    return "extrapolated" if rows > max(points) else "interpolated"


def _best_cell(row: dict | None) -> str:
    return "-" if row is None else f"x{row['projected_speedup']:.2f} ({row['budget']})"


def parse_args(argv: list[str] | None) -> CheckConfig:
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = CheckConfig(device="cpu")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), float32, ...")
    parser.add_argument("--sizes", type=lambda t: t.split(","), default=list(SIZES), help=f"of {','.join(SHAPES)}")
    parser.add_argument("--batches", type=ints, default=list(BATCHES))
    parser.add_argument("--rows", type=ints, default=list(ROWS), help="verify rows per request (root + drafts)")
    parser.add_argument("--context", type=int, default=defaults.context, help="cached tokens per request")
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument("--time-budget-s", type=float, default=defaults.time_budget_s)
    parser.add_argument("--pytest-timeout-s", type=float, default=defaults.pytest_timeout_s)
    parser.add_argument("--no-tests", dest="run_tests", action="store_false", help="skip the gpu-marked tests")
    parser.add_argument("--out", default=defaults.out)
    return CheckConfig(**vars(parser.parse_args(argv)))


def _quiet_transformers() -> None:
    """No progress bars or load reports from transformers (the table is the output)."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    cfg = parse_args(argv)
    _quiet_transformers()
    deadline, report = Deadline(cfg.time_budget_s), Report(cfg.out)
    report.data.update(config=asdict(cfg), env=environment(cfg), forward={})
    report.data["greedy"] = guarded(greedy_identity, cfg, label={"section": "greedy"})
    report.save()
    if cfg.run_tests:
        report.data["gpu_tests"] = guarded(run_gpu_tests, cfg, deadline)
        report.save()
    for size in cfg.sizes:
        failed = guarded(time_forward, cfg, size, deadline, report)
        if "error" in failed:  # the cells measured before it stay
            report.data["forward"].setdefault(size, {"cells": []}).update(failed)
        report.save()
    report.data["projection"] = projection(report.data["forward"], replayed_tau())
    report.data["seconds"] = round(time.monotonic() - started, 1)
    report.save()
    print(table(report.data))
    print(f"wrote {cfg.out} in {report.data['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
