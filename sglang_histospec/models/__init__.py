"""Real models prepared from installed packages (``histospec model prepare``), and the project's cache directory.

The toy model's pretraining (``models/demo_model.py``) and its tokenizer (``models/demo_tokenizer.py``) are imported
from their modules."""

from sglang_histospec.models.cache import cached_build, default_cache_dir
from sglang_histospec.models.prepare import MODELS, model_info, prepare_model, prepared_dir, resolve_model

__all__ = [
    "MODELS",
    "cached_build",
    "default_cache_dir",
    "model_info",
    "prepare_model",
    "prepared_dir",
    "resolve_model",
]
