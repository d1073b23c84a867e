"""The project's cache directory and an atomic build-once helper for what is cached there.

Example: ``cached_build(default_cache_dir() / "models" / "m", "meta.json", lambda d: {"steps": train(d)})``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    """``$HISTOSPEC_CACHE_DIR`` or ``~/.cache/sglang-histospec``."""
    return Path(os.environ.get("HISTOSPEC_CACHE_DIR", Path.home() / ".cache" / "sglang-histospec"))


def cached_build(final: Path, marker: str, build: Callable[[Path], dict]) -> Path:
    """``final`` once it holds ``marker``; else ``build(tmp)`` writes a directory next to it, its returned dict
    becomes ``tmp/marker`` (JSON) and ``tmp`` is renamed to ``final`` (atomic: a concurrent builder's result wins).

    Example: ``cached_build(root / "m", "meta.json", lambda d: {"steps": train(d)})``.
    """
    if (final / marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        meta = build(tmp)
        (tmp / marker).write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(final)
        except OSError:
            if not (final / marker).is_file():  # another process won the race; otherwise a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
