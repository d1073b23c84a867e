"""SGLang ``/generate`` bodies item by item (pure: no HTTP): split a batched body and join it back
(:func:`split_generate_body`, :func:`join_generate_items`), an item's history key (:func:`item_prompt_id`) and an
answer made of a migrated request's two parts (:func:`joined`).

Example: ``split_generate_body({"input_ids": [[1], [2]]})`` gives two one-item bodies and ``True``;
``join_generate_items`` of them gives the batched body back.
"""

from __future__ import annotations

import json
from typing import Any

from sglang_histospec.drafting.prompt_ids import explicit_prompt_id, prompt_id_for
from sglang_histospec.router.config import RouterError

PER_ITEM_KEYS = (
    "input_ids",
    "text",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
)
"""Fields of a batched SGLang /generate body that may hold one value per item."""


def joined(head: dict[str, Any] | None, tail: dict[str, Any]) -> dict[str, Any]:
    """An answer made of ``head`` (an aborted part, or None) followed by ``tail``.

    Example: head ``output_ids`` [1, 2], tail [3]: ``output_ids`` [1, 2, 3], ``meta_info.completion_tokens`` 3.
    """
    if head is None:
        return dict(tail)
    out = dict(tail)
    meta = dict(tail.get("meta_info") or {})
    head_meta = head.get("meta_info") or {}
    out["output_ids"] = list(head.get("output_ids") or []) + list(tail.get("output_ids") or [])
    out["text"] = (head.get("text") or "") + (tail.get("text") or "")
    meta["completion_tokens"] = len(out["output_ids"])
    meta["prompt_tokens"] = meta.get("prompt_tokens", 0)
    if "output_token_logprobs" in head_meta or "output_token_logprobs" in meta:
        meta["output_token_logprobs"] = list(head_meta.get("output_token_logprobs") or []) + list(
            meta.get("output_token_logprobs") or []
        )
    for key in ("spec_verify_ct", "spec_draft_token_num", "spec_accept_token_num", "e2e_latency"):
        if isinstance(meta.get(key), (int, float)) and isinstance(head_meta.get(key), (int, float)):
            meta[key] = meta[key] + head_meta[key]
    out["meta_info"] = meta
    return out


def dumps(body: Any) -> bytes:
    """JSON with non-ASCII escaped: encodes whatever the client sent."""
    return json.dumps(body, separators=(",", ":")).encode()


def item_prompt_id(item: dict[str, Any]) -> str | None:
    """The history key of one /generate item, by the servers' rule (``drafting/prompt_ids.py``); None for a
    ``text`` item without ``custom_params.prompt_id`` (the router has no tokenizer: such items get the prior).

    Example: ``item_prompt_id({"input_ids": [1, 2]}) == token_prompt_id([1, 2])``.
    """
    custom = (item.get("sampling_params") or {}).get("custom_params")
    ids = item.get("input_ids")
    return prompt_id_for(custom, ids) if ids else explicit_prompt_id(custom)


def completion_tokens(out: dict[str, Any]) -> int:
    """Tokens an answer emitted: ``meta_info.completion_tokens``, else its ``output_ids``."""
    meta = out.get("meta_info") or {}
    n = meta.get("completion_tokens")
    return int(n) if isinstance(n, int) else len(out.get("output_ids") or [])


def is_batch(body: dict[str, Any]) -> bool:
    """True for a batched /generate body (a list of texts or of token lists)."""
    ids = body.get("input_ids")
    return isinstance(body.get("text"), list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))


def split_generate_body(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Split an SGLang /generate body into single-item bodies; returns (items, was_batch).

    Example: ``{"input_ids": [[1], [2]], "sampling_params": {"max_new_tokens": 4}}`` gives two items with the
    same sampling params and ``True``.
    """
    if not isinstance(body, dict):
        raise RouterError(400, "the /generate body must be a JSON object")
    if isinstance(body.get("input_ids"), list) and body["input_ids"] and isinstance(body["input_ids"][0], list):
        n, key = len(body["input_ids"]), "input_ids"
    elif isinstance(body.get("text"), list):
        n, key = len(body["text"]), "text"
    elif "input_ids" in body or "text" in body:
        return [dict(body)], False
    else:
        raise RouterError(400, "the /generate body needs 'input_ids' or 'text'")
    if n == 0:
        raise RouterError(400, f"'{key}' is an empty batch")
    for k, v in body.items():
        if k != key and k in PER_ITEM_KEYS and isinstance(v, list) and len(v) != n:
            raise RouterError(400, f"'{k}' has {len(v)} items for a batch of {n}")
    items = []
    for i in range(n):
        per_item = {k: v[i] for k, v in body.items() if k == key or (k in PER_ITEM_KEYS and isinstance(v, list))}
        items.append({**body, **per_item})
    return items, True


def join_generate_items(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The inverse of :func:`split_generate_body`: one batched body (every field per item)."""
    keys: list[str] = []
    for item in items:
        keys += [k for k in item if k not in keys]
    body: dict[str, Any] = {}
    for k in keys:
        values = [item.get(k) for item in items]
        if k in ("input_ids", "text", "sampling_params", "rid") or (
            k in PER_ITEM_KEYS and any(v != values[0] for v in values)
        ):
            body[k] = values
        elif any(v != values[0] for v in values):
            raise RouterError(400, f"field {k!r} differs between the items of one backend call")
        else:
            body[k] = values[0]
    if "input_ids" not in body and "text" not in body:
        raise RouterError(400, "items need 'input_ids' or 'text'")
    return body
