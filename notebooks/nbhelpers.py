"""Shared parameter handling of the notebooks: which trace to read, and how small to run.

Every notebook calls :func:`settings` in its parameter cell and :func:`resolve_trace` right after. A trace comes
from, in this order: the notebook's ``TRACE`` parameter (or ``$HISTOSPEC_NB_TRACE``), the trace of the last
``histospec demo`` run (:func:`demo_trace`), or a small synthetic trace written by the project's generator
(``sglang_histospec.trace.synth``), which is labelled SYNTHETIC wherever it is shown.

Example::

    >>> s = settings()                     # reads $HISTOSPEC_NB_TRACE and $HISTOSPEC_NB_SMALL
    >>> path, label = resolve_trace(s.trace, s.small)
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The repository root (notebooks/ lives directly under it)."""
SYNTHETIC = "SYNTHETIC"
"""Prefix of the label of a generated trace: figures made from it are not results of a real run."""


@dataclass(frozen=True)
class Settings:
    """Notebook parameters read from the environment (CI and ``notebooks/run.py`` set them)."""

    trace: str | None
    """``$HISTOSPEC_NB_TRACE``: a ``.jsonl(.gz)`` trace; None = the demo's trace, else a synthetic one."""
    small: bool
    """``$HISTOSPEC_NB_SMALL=1``: small configurations (CI, about 10-30 s per notebook)."""
    demo_dir: Path
    """``$HISTOSPEC_DEMO_DIR`` (relative to the repository root) or ``<repo>/histospec-demo`` (where ``make demo``
    writes): the demo's ``trace.jsonl.gz`` and ``summary.json``."""
    run_demo: bool
    """``$HISTOSPEC_NB_RUN_DEMO``: 04_training runs ``histospec demo --quick`` when the demo output is missing
    (default: yes, except in small configurations)."""


def settings() -> Settings:
    """The parameters of this run, from the environment."""
    small = os.environ.get("HISTOSPEC_NB_SMALL", "") not in ("", "0")
    return Settings(
        trace=os.environ.get("HISTOSPEC_NB_TRACE") or None,
        small=small,
        demo_dir=REPO / (os.environ.get("HISTOSPEC_DEMO_DIR") or "histospec-demo"),  # relative: to the repository
        run_demo=os.environ.get("HISTOSPEC_NB_RUN_DEMO", "0" if small else "1") not in ("", "0"),
    )


def demo_trace(demo_dir: str | os.PathLike) -> Path | None:
    """``demo_dir/trace.jsonl.gz`` (what ``histospec demo`` writes), else the newest ``*.jsonl(.gz)`` under
    ``demo_dir``, or None."""
    root = Path(demo_dir)
    if not root.is_dir():
        return None
    if (root / "trace.jsonl.gz").is_file():
        return root / "trace.jsonl.gz"
    found = [p for pat in ("*.jsonl.gz", "*.jsonl") for p in root.rglob(pat) if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def synthetic_config(small: bool, **overrides):  # noqa: ANN201 (SynthConfig; imported lazily)
    """The generator settings of the fallback trace (long-tailed lengths, 3 epochs; about 32k response tokens,
    small: 11k); ``overrides`` are ``SynthConfig`` fields (e.g. more prompts per step for HistoPipe)."""
    from sglang_histospec.trace.synth import SynthConfig

    if small:
        base = dict(prompts=12, group_size=4, epochs=3, mean_len=48, vocab=1000, prompt_len=16, seed=0)
    else:
        base = dict(prompts=24, group_size=8, epochs=3, mean_len=48, max_len=1024, vocab=4000, prompt_len=24, seed=0)
    return SynthConfig(**{**base, **overrides})


def resolve_trace(
    trace: str | os.PathLike | None, small: bool, demo_dir: str | os.PathLike | None = None, **synth_overrides
) -> tuple[str, str]:
    """``(path, label)`` of the trace a notebook should read (see the module docstring); ``synth_overrides``
    change the fallback synthetic trace (``SynthConfig`` fields).

    Raises ValueError when ``trace`` is given but is not a file.
    """
    if trace:
        if not Path(trace).is_file():
            raise ValueError(f"TRACE={str(trace)!r} is not a file; pass a .jsonl or .jsonl.gz rollout trace")
        return str(trace), f"trace {trace}"
    found = demo_trace(demo_dir if demo_dir is not None else settings().demo_dir)
    if found is not None:
        return str(found), f"demo trace {found}"
    from sglang_histospec.trace.synth import write_synthetic

    cfg = synthetic_config(small, **synth_overrides)
    path = Path(tempfile.mkdtemp(prefix="histospec-nb-")) / "synthetic.jsonl.gz"
    write_synthetic(str(path), cfg)
    return str(path), (
        f"{SYNTHETIC} trace ({cfg.prompts} prompts x {cfg.group_size} samples x {cfg.epochs} epochs"
        f"{f' x {cfg.steps_per_epoch} steps' if cfg.steps_per_epoch > 1 else ''}, "
        "trace/synth.py; not a real run)"
    )


def demo_summary(demo_dir: str | os.PathLike) -> tuple[dict, str | None] | None:
    """``(summary, trace path)`` of the ``histospec demo`` run in ``demo_dir`` (its ``summary.json``), or None.

    The summary's ``trace`` is resolved against the working directory, the repository root and ``demo_dir``
    (the demo records it relative to where it ran); the path is None when none of them has the file.
    """
    import json

    path = Path(demo_dir) / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    rel = Path(summary.get("trace") or "trace.jsonl.gz")
    for cand in (rel, REPO / rel, Path(demo_dir) / rel.name):
        if cand.is_file():
            return summary, str(cand)
    return summary, None


def run_demo(demo_dir: str | os.PathLike, args: list[str]) -> None:
    """Run ``histospec demo ARGS --out-dir DEMO_DIR --json`` with this interpreter; prints its last lines.

    Raises RuntimeError with the demo's output when it fails.
    """
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "sglang_histospec.cli",
        "demo",
        *args,
        "--out-dir",
        str(demo_dir),
        "--no-progress",
        "--json",
    ]
    print("running:", " ".join(cmd[2:]), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-25:])
    if proc.returncode != 0:
        raise RuntimeError(f"histospec demo failed (exit {proc.returncode}):\n{tail}")
    print("\n".join(ln for ln in tail.splitlines() if not ln.startswith("{")))
