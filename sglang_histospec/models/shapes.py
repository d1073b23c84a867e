"""Llama-shaped models with random weights, for measuring the engine where no real weights can be downloaded.

The shapes are kept here, in the repository: ``tiny`` (the 2-layer test model's shape), ``0.5b`` and ``1.5b``
(the layer widths of Qwen2.5-0.5B and -1.5B, tied embeddings, as Llama layers without QKV bias) and ``8b``
(Llama-3.1-8B). A forward pass costs what the real model's does; the tokens it predicts mean nothing.

Example::

    parameter_count("tiny")                                  # 82_240 (the embeddings and the LM head included)
    model = random_model("tiny", device="cpu", dtype="float32", seed=0)
    sum(p.numel() for p in model.parameters()) == parameter_count("tiny")
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """The sizes of a Llama decoder (``transformers.LlamaConfig`` names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool
    initializer_range: float = 0.02
    """Standard deviation of the random weights (the tiny test model uses 0.2: peaked, clear argmaxes)."""
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


SHAPES = {
    "tiny": LlamaShape(64, 64, 128, 2, 4, 2, tie_word_embeddings=False, initializer_range=0.2),
    "0.5b": LlamaShape(151936, 896, 4864, 24, 14, 2, tie_word_embeddings=True, rope_theta=1e6),
    "1.5b": LlamaShape(151936, 1536, 8960, 28, 12, 2, tie_word_embeddings=True, rope_theta=1e6),
    "8b": LlamaShape(128256, 4096, 14336, 32, 32, 8, tie_word_embeddings=False, rope_theta=5e5),
}
"""Model sizes by name; ``random_model`` builds any of them."""


def _shape(size: str) -> LlamaShape:
    if size not in SHAPES:
        raise ValueError(f"model size {size!r} is unknown; use one of {', '.join(SHAPES)}")
    return SHAPES[size]


def parameter_count(size: str) -> int:
    """Parameters of the model ``size`` (a tied LM head counted once). Example: ``parameter_count("8b")`` is
    8_030_261_248, Llama-3.1-8B's count."""
    s = _shape(size)
    kv_width = s.num_key_value_heads * s.head_dim
    attention = 2 * s.hidden_size * s.hidden_size + 2 * s.hidden_size * kv_width
    layer = attention + 3 * s.hidden_size * s.intermediate_size + 2 * s.hidden_size  # + the two norms
    embeddings = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
    return s.num_hidden_layers * layer + embeddings + s.hidden_size  # + the final norm


def llama_config(size: str):
    """The ``transformers.LlamaConfig`` of ``size`` (bos 1, eos 2, pad 0, as the tiny test models)."""
    from transformers import LlamaConfig

    return LlamaConfig(**asdict(_shape(size)), bos_token_id=1, eos_token_id=2, pad_token_id=0)


def random_model(size: str, device: str = "cpu", dtype: str = "float32", seed: int = 0):
    """A ``LlamaForCausalLM`` of shape ``size`` with transformers' random initialisation, built on ``device``
    (weights are created there, not copied: an 8B model in bfloat16 needs 16 GB of that device's memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = llama_config(size)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.eval()


__all__ = ["SHAPES", "LlamaShape", "llama_config", "parameter_count", "random_model"]
