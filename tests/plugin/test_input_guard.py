"""The plugin's vocabulary check inside SGLang's tokenizer manager (``plugin/input_guard.py``), without SGLang."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_histospec.plugin.input_guard import first_bad_token, refuse_out_of_vocabulary

MANAGER = SimpleNamespace(model_config=SimpleNamespace(vocab_size=64))
TEXT_ONLY = SimpleNamespace(image_data=None, video_data=None, audio_data=None, input_embeds=None)


@pytest.mark.parametrize(
    ("ids", "bad"),
    [([1, 5, 63], None), ([1, 5, 64], (2, 64)), ([-1, 3], (0, -1)), ([], None), ([7, 10**9, -5], (1, 10**9))],
)
def test_first_bad_token(ids, bad) -> None:
    assert first_bad_token(ids, 64) == bad


def test_hook_refuses_text_only_requests_outside_the_vocabulary() -> None:
    assert refuse_out_of_vocabulary(MANAGER, TEXT_ONLY, [1, 5, 63]) is None
    with pytest.raises(ValueError, match=r"input_ids\[2\]: token id 64 is outside the vocabulary \[0, 64\)"):
        refuse_out_of_vocabulary(MANAGER, TEXT_ONLY, [1, 5, 64])


def test_hook_leaves_multimodal_requests_and_unknown_models_alone() -> None:
    image = SimpleNamespace(image_data=["img"], video_data=None, audio_data=None, input_embeds=None)
    assert refuse_out_of_vocabulary(MANAGER, image, [1, 10**9]) is None  # SGLang's placeholder ids
    assert refuse_out_of_vocabulary(SimpleNamespace(), TEXT_ONLY, [1, 10**9]) is None
    assert refuse_out_of_vocabulary(MANAGER, TEXT_ONLY, None) is None
