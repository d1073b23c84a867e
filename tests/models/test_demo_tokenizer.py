"""The toy model's character tokenizer: one token per character of the arithmetic task, saved and reloaded."""

from __future__ import annotations

from sglang_histospec.models.demo_tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from sglang_histospec.tasks.arith import ALPHABET, ArithTask, TaskConfig, all_solutions, parse


def test_tokenizer_round_trip_and_reload(tmp_path):
    from transformers import AutoTokenizer

    tok = build_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert len(tok) == 4 + len(ALPHABET)
    task = ArithTask(TaskConfig(seed=4, num_prompts=16))
    texts = [p.text + s for p in task.prompts for s in all_solutions(parse(p.text[:-1]))]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in texts:
        ids = tok(text).input_ids
        assert ids[0] == BOS_ID and len(ids) == len(text) + 1  # one token per character
        assert tok.decode(ids + [EOS_ID], skip_special_tokens=True) == text
        assert again(text).input_ids == ids
    assert again.padding_side == "left"
    assert tok("3x").input_ids[-1] == tok.unk_token_id
