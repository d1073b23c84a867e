"""Embedded torch engine: batched generation with lossless HistoSpec tree verification.

``from sglang_histospec.engine import EngineConfig, SamplingParams, GenerateRequest, GenerateResult`` needs no
torch; ``from sglang_histospec.engine import Engine`` (or ``sglang_histospec.engine.engine``) imports torch and
transformers.
"""

from sglang_histospec.engine.types import (
    SPECULATIVE_ALGORITHMS,
    SUPPORTED_ARCHITECTURES,
    EngineConfig,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)

__all__ = [
    "SPECULATIVE_ALGORITHMS",
    "SUPPORTED_ARCHITECTURES",
    "Engine",
    "EngineConfig",
    "GenerateRequest",
    "GenerateResult",
    "SamplingParams",
]


def __getattr__(name: str):
    if name == "Engine":
        from sglang_histospec.engine.engine import Engine

        return Engine
    raise AttributeError(name)
