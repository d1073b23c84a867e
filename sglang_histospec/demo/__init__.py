"""The demo's building blocks: a bundled arithmetic reasoning task with a verifiable reward, its character-level
tokenizer, and a tiny causal LM pretrained on CPU and cached on disk.

Importing this package is light (torch and transformers are imported inside the functions that need them).

Example::

    from sglang_histospec.demo import ArithTask, build_or_load_demo_model
    path = build_or_load_demo_model(quick=True)   # a directory for AutoModelForCausalLM / the embedded engine
    task = ArithTask()                            # task.prompts: the fixed RL prompt set; task.reward(p, c)
"""

from sglang_histospec.demo.model import (
    CONVERGED_CONFIG,
    DEMO_MODELS,
    QUICK_CONFIG,
    DemoModelConfig,
    PretrainResult,
    build_or_load_demo_model,
    default_cache_dir,
    load_meta,
)
from sglang_histospec.demo.task import ArithTask, TaskConfig, TaskPrompt
from sglang_histospec.demo.tokenizer import build_tokenizer

__all__ = [
    "CONVERGED_CONFIG",
    "DEMO_MODELS",
    "QUICK_CONFIG",
    "ArithTask",
    "DemoModelConfig",
    "PretrainResult",
    "TaskConfig",
    "TaskPrompt",
    "build_or_load_demo_model",
    "build_tokenizer",
    "default_cache_dir",
    "load_meta",
]
