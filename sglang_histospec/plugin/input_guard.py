"""A token-id check inside SGLang's tokenizer manager, so that an id outside the vocabulary is refused with a 400
instead of crashing the scheduler (SGLang 0.5.23 does not check ``input_ids`` against the vocabulary: the
embedding lookup raises ``IndexError`` in the scheduler process, which takes the whole server down;
docs/reliability.md).

Registered through SGLang's own plugin hooks (``sglang.srt.plugins.hook_registry``), as a ``BEFORE`` hook of
``TokenizerManager._validate_one_request``, in the process that serves HTTP: every generation route
(``/generate``, ``/v1/completions``, ``/v1/chat/completions``) of any SGLang server in an environment where this
package is installed, with or without ``--speculative-algorithm HISTOSPEC``. Multimodal requests are left alone
(SGLang puts placeholder ids beyond the vocabulary into their prompts).

Example: ``first_bad_token([1, 5, 64], 64) == (2, 64)``; SGLang then answers
``400 {"error": {"message": "input_ids[2]: token id 64 is outside the vocabulary [0, 64)"}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HOOK_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
_MULTIMODAL_FIELDS = ("image_data", "video_data", "audio_data", "input_embeds")


def first_bad_token(input_ids: Sequence[int], vocab_size: int) -> tuple[int, int] | None:
    """(position, id) of the first id outside ``[0, vocab_size)``, or None when all are inside."""
    if not input_ids or (min(input_ids) >= 0 and max(input_ids) < vocab_size):
        return None
    j = next(j for j, tok in enumerate(input_ids) if not 0 <= tok < vocab_size)
    return j, int(input_ids[j])


def refuse_out_of_vocabulary(manager: Any, obj: Any, input_ids: Sequence[int] | None, *args: Any, **kw: Any) -> None:
    """The hook: ValueError (SGLang answers it with a 400) when a text-only request has an id outside the model's
    vocabulary; SGLang's own checks run afterwards."""
    if input_ids is None or any(getattr(obj, name, None) is not None for name in _MULTIMODAL_FIELDS):
        return None
    vocab_size = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if not isinstance(vocab_size, int):
        return None
    bad = first_bad_token(input_ids, vocab_size)
    if bad is not None:
        j, tok = bad
        raise ValueError(f"input_ids[{j}]: token id {tok} is outside the vocabulary [0, {vocab_size})")
    return None


def register_input_guard() -> None:
    """Register the hook with SGLang's hook registry (applied by SGLang's ``load_plugins``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_TARGET, refuse_out_of_vocabulary, HookType.BEFORE)
