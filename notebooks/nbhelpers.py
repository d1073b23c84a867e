"""Shared parameter handling of the notebooks: which trace to read, and how small to run.

Every notebook calls :func:`settings` in its parameter cell and :func:`resolve_trace` right after. A trace comes
from, in this order: the notebook's ``TRACE`` parameter (or ``$HISTOSPEC_NB_TRACE``), the trace of the last
``histospec demo`` run (:func:`demo_trace`), or a small synthetic trace written by the project's generator
(``sglang_histospec.core.synth``), which is labelled SYNTHETIC wherever it is shown.

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
    """``$HISTOSPEC_DEMO_DIR`` or ``<repo>/runs/demo``: where ``histospec demo`` writes its trace and summary."""


def settings() -> Settings:
    """The parameters of this run, from the environment."""
    return Settings(
        trace=os.environ.get("HISTOSPEC_NB_TRACE") or None,
        small=os.environ.get("HISTOSPEC_NB_SMALL", "") not in ("", "0"),
        demo_dir=Path(os.environ.get("HISTOSPEC_DEMO_DIR") or REPO / "runs" / "demo"),
    )


def demo_trace(demo_dir: str | os.PathLike) -> Path | None:
    """The newest rollout trace (``*.jsonl.gz`` or ``*.jsonl``) under ``demo_dir``, or None."""
    root = Path(demo_dir)
    if not root.is_dir():
        return None
    found = [p for pat in ("*.jsonl.gz", "*.jsonl") for p in root.rglob(pat) if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def synthetic_config(small: bool, **overrides):  # noqa: ANN201 (SynthConfig; imported lazily)
    """The generator settings of the fallback trace: long-tailed lengths, 4 epochs (small: 3); ``overrides`` are
    ``SynthConfig`` fields (e.g. more prompts per step for the HistoPipe simulation)."""
    from sglang_histospec.core.synth import SynthConfig

    if small:
        base = dict(prompts=12, group_size=4, epochs=3, mean_len=48, vocab=1000, prompt_len=16, seed=0)
    else:
        base = dict(prompts=48, group_size=8, epochs=4, mean_len=96, vocab=4000, prompt_len=24, seed=0)
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
    from sglang_histospec.core.synth import write_synthetic

    cfg = synthetic_config(small, **synth_overrides)
    path = Path(tempfile.mkdtemp(prefix="histospec-nb-")) / "synthetic.jsonl.gz"
    write_synthetic(str(path), cfg)
    return str(path), (
        f"{SYNTHETIC} trace ({cfg.prompts} prompts x {cfg.group_size} samples x {cfg.epochs} epochs"
        f"{f' x {cfg.steps_per_epoch} steps' if cfg.steps_per_epoch > 1 else ''}, "
        "core/synth.py; not a real run)"
    )
