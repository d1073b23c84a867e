"""Stable prompt ids for the history drafter: a dataset column, or the servers' rule on the prompt tokens.

The drafter keys its history by prompt id, so the id must be the same every time a prompt comes back (every epoch,
on every rank, in every process). A dataset column (default ``prompt_id``) is used as is; a row without it gets
None here and, once TRL has tokenized its prompt, the id every server would derive from those tokens
(:func:`sglang_histospec.drafting.prompt_ids.token_prompt_id`, applied by ``generation.py`` and ``rollout.py``).

Example::

    resolve_prompt_ids([{"prompt": "2+2=", "prompt_id": "p7"}], column="prompt_id", hash_missing=True)  # ['p7']
    resolve_prompt_ids([{"prompt": "2+2="}], column="prompt_id", hash_missing=True)   # [None]: from the tokens
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

HASH_PREFIX = "h-"
"""Ids of :func:`stable_prompt_id` start with this, so they never collide with short user ids such as ``"7"``."""


def stable_prompt_id(prompt: Any) -> str:
    """``"h-"`` + 16 hex digits of the SHA-256 of the prompt's canonical JSON (keys sorted, no whitespace).

    Not the default any more (ids are derived from the prompt tokens, as the servers do); kept for a
    ``make_rollout_func(prompt_id_fn=stable_prompt_id)`` that wants ids keyed by the text.

    Example: ``stable_prompt_id("2+2=") == stable_prompt_id("2+2=")`` in every process; chat prompts
    (``[{"role": "user", "content": "hi"}]``) hash their whole message list.
    """
    try:
        text = json.dumps(prompt, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"prompt of type {type(prompt).__name__} cannot be hashed into a prompt id ({exc})") from exc
    return HASH_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def resolve_prompt_ids(rows: Sequence[Mapping[str, Any]], column: str | None, hash_missing: bool) -> list[str | None]:
    """One prompt id per dataset row: ``row[column]`` (as a string) when present, else None (derived later from
    the prompt tokens, see the module docstring).

    Raises ValueError when a row has no id and ``hash_missing`` is False, or when an id is empty.
    """
    out: list[str | None] = []
    for i, row in enumerate(rows):
        value = row.get(column) if column else None
        if value is None:
            if not hash_missing:
                raise ValueError(
                    f"row {i} of the batch has no {column!r} column (columns: {sorted(row)}); add a stable id column "
                    f"(ds = ds.map(lambda ex, i: {{{column!r}: str(i)}}, with_indices=True)), set prompt_id_column to "
                    "the name of an existing one, or set hash_prompt_ids=True to use a hash of the prompt"
                )
            if "prompt" not in row:
                raise ValueError(f"row {i} has neither {column!r} nor 'prompt'; cannot derive a prompt id")
            out.append(None)
            continue
        pid = str(value)
        if not pid:
            raise ValueError(f"row {i}: {column!r} is empty; prompt ids must be non-empty strings")
        out.append(pid)
    return out
