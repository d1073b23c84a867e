"""Tiny random Hugging Face models and a char-level tokenizer for tests (shared by engine, server, TRL, plugin).

Example::

    from tests.helpers.tiny import make_tiny_model_dir
    path = make_tiny_model_dir(tmp_path / "m", arch="llama", vocab_size=64, seed=0)
    # path holds config.json, model.safetensors, tokenizer.json, tokenizer_config.json
    tok = AutoTokenizer.from_pretrained(path); tok("ab+1").input_ids  ->  [1, 5, 6, 41, 32]  (<s> prepended)

Token ids: 0 <pad>, 1 <s> (BOS), 2 </s> (EOS), 3 <unk>, then characters of ``CHARS`` (as many as fit), then
``<extra_i>`` fillers up to ``vocab_size``.
"""

from __future__ import annotations

import os
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
CHARS = " abcdefghijklmnopqrstuvwxyz0123456789+-*/=.,?!:;()ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
ARCHS = ("llama", "qwen2", "qwen3")


def make_char_tokenizer(vocab_size: int = 64):
    """A char-level ``PreTrainedTokenizerFast`` with exactly ``vocab_size`` tokens (>= 8)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 8:
        raise ValueError(f"vocab_size={vocab_size}; use at least 8")
    chars = CHARS[: vocab_size - len(SPECIAL_TOKENS)]
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for c in chars:
        vocab[c] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def tiny_config(arch: str = "llama", vocab_size: int = 64, **overrides):
    """A 2-layer, 64-wide config of the given architecture ("llama", "qwen2", "qwen3"), GQA 4:2 heads."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    if arch not in classes:
        raise ValueError(f"arch={arch!r}; use one of {ARCHS}")
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    if arch == "qwen3":
        kwargs["head_dim"] = 16
    kwargs.update(overrides)
    return classes[arch](**kwargs)


def make_tiny_model_dir(
    path: str | os.PathLike,
    arch: str = "llama",
    vocab_size: int = 64,
    seed: int = 0,
    with_tokenizer: bool = True,
    **config_overrides,
) -> str:
    """Build a tiny randomly initialised causal LM, save it (and a char tokenizer) to ``path``; return the path.

    ``initializer_range`` defaults to 0.2 (not HF's 0.02), so the random model's next-token distributions are
    peaked enough for greedy tests to have clear argmaxes and for sampling tests to be non-uniform.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_config(arch, vocab_size, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(path)
    if with_tokenizer:
        make_char_tokenizer(vocab_size).save_pretrained(path)
    return str(path)
