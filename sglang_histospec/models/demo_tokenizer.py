"""Character-level tokenizer of the demo task, built with the ``tokenizers`` library (no hub download).

One token per character of :data:`~sglang_histospec.tasks.arith.ALPHABET`, plus ``<pad>`` (0), ``<s>`` (1),
``</s>`` (2) and ``<unk>`` (3). Encoding prepends ``<s>``; decoding joins characters without spaces.

Example:
    >>> tok = build_tokenizer()
    >>> tok("3+4=").input_ids
    [1, 7, 14, 8, 19]
    >>> tok.decode([1, 7, 14, 8, 19, 2], skip_special_tokens=True)
    '3+4='
"""

from __future__ import annotations

from sglang_histospec.tasks.arith import ALPHABET

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def build_tokenizer(alphabet: str = ALPHABET):
    """A ``transformers.PreTrainedTokenizerFast`` with one token per character of ``alphabet``.

    ``alphabet`` must hold distinct single characters (no whitespace). The ids are stable: specials first, then
    the characters in the given order, so the same alphabet always gives the same vocabulary.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet) or any(c.isspace() for c in alphabet):
        raise ValueError(f"alphabet={alphabet!r}: use distinct, non-whitespace characters")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *alphabet])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)]
    )
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",  # batched generation pads prompts on the left
    )
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    return tok
