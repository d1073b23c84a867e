"""The one prompt-id rule: the history key of a request, used by the servers, the plugin, the router and the trainer.

An explicit ``custom_params["prompt_id"]`` (a string or an integer) wins; without one, the id is ``"tokens:"`` + the
SHA-1 of the prompt tokens as little-endian int64, the same in every process, on every rank and on every path
(the torch backend, the SGLang plugin, the router's length predictor, the trainer's history pushes).

Example::

    prompt_id_for({"prompt_id": 7}, [1, 2])   # '7'
    prompt_id_for(None, [1, 2])               # 'tokens:' + 40 hex digits, == token_prompt_id([1, 2])
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PROMPT_ID_KEY = "prompt_id"
"""Key of the prompt (group) id in ``sampling_params.custom_params``."""

TOKEN_ID_PREFIX = "tokens:"
"""Derived ids start with this, so they never collide with short user ids such as ``"7"``."""


def token_prompt_id(prompt_tokens: Sequence[int]) -> str:
    """The derived id of a prompt: ``"tokens:"`` + SHA-1 of its tokens as int64 (47 characters).

    Example: ``token_prompt_id([1, 2]) == token_prompt_id((1, 2))``; ``token_prompt_id([1, 2]) != token_prompt_id([2, 1])``.
    """
    tokens = np.asarray(list(prompt_tokens), dtype="<i8")
    if tokens.size == 0:
        raise ValueError("the prompt has no tokens; a prompt id is derived from at least one token")
    return TOKEN_ID_PREFIX + hashlib.sha1(tokens.tobytes()).hexdigest()


def explicit_prompt_id(custom_params: Mapping[str, Any] | None) -> str | None:
    """``custom_params["prompt_id"]`` as a string, or None when absent.

    Example: ``explicit_prompt_id({"prompt_id": 7}) == "7"``; ``explicit_prompt_id({}) is None``.
    """
    pid = custom_params.get(PROMPT_ID_KEY) if custom_params else None
    if pid is None:
        return None
    if not isinstance(pid, str | int) or isinstance(pid, bool):
        raise ValueError(f"custom_params.prompt_id={pid!r}; use a string or an integer")
    if pid == "":
        raise ValueError("custom_params.prompt_id is empty; use a non-empty string or leave it out")
    return str(pid)


def prompt_id_for(custom_params: Mapping[str, Any] | None, prompt_tokens: Sequence[int]) -> str:
    """The history key of a request: ``custom_params["prompt_id"]`` if given, else :func:`token_prompt_id`.

    Example: ``prompt_id_for({"prompt_id": "p7"}, [1, 2]) == "p7"``; ``prompt_id_for({}, [1, 2]).startswith("tokens:")``.
    """
    pid = explicit_prompt_id(custom_params)
    return pid if pid is not None else token_prompt_id(prompt_tokens)
