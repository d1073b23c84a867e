"""The random-weight Llama shapes of the GPU check: their parameter counts, and a tiny one built for real."""

from __future__ import annotations

import pytest
import torch

from sglang_histospec.models.shapes import SHAPES, llama_config, parameter_count, random_model


@pytest.mark.parametrize(
    "size, low, high",
    [("tiny", 1e4, 1e6), ("0.5b", 0.4e9, 0.6e9), ("1.5b", 1.4e9, 1.7e9), ("8b", 7.5e9, 8.5e9)],
)
def test_parameter_count_is_the_built_models_and_near_its_name(size, low, high):
    model = random_model(size, device="meta", dtype="bfloat16")  # no memory: shapes only
    assert sum(p.numel() for p in model.parameters()) == parameter_count(size)
    assert low <= parameter_count(size) <= high


def test_config_carries_the_shape():
    cfg = llama_config("8b")
    s = SHAPES["8b"]
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.vocab_size) == (s.hidden_size, 8, s.vocab_size)
    assert cfg.model_type == "llama" and cfg.head_dim == s.head_dim


def test_random_model_is_seeded():
    a, b, c = (random_model("tiny", seed=s) for s in (1, 1, 2))
    w = [m.model.layers[0].mlp.up_proj.weight for m in (a, b, c)]
    assert torch.equal(w[0], w[1]) and not torch.equal(w[0], w[2])
    assert w[0].dtype == torch.float32 and not torch.all(w[0] == 0)


def test_unknown_size_names_the_choices():
    with pytest.raises(ValueError, match="model size '70b' is unknown; use one of tiny, 0.5b, 1.5b, 8b"):
        parameter_count("70b")
