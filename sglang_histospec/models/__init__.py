"""Real models prepared from installed packages (``histospec model prepare``), and the project's cache directory."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$HISTOSPEC_CACHE_DIR`` or ``~/.cache/sglang-histospec``."""
    return Path(os.environ.get("HISTOSPEC_CACHE_DIR", Path.home() / ".cache" / "sglang-histospec"))


from sglang_histospec.models.prepare import MODELS, model_info, prepare_model, prepared_dir, resolve_model  # noqa: E402

__all__ = ["MODELS", "default_cache_dir", "model_info", "prepare_model", "prepared_dir", "resolve_model"]
