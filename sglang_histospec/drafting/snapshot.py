"""Snapshot file of a drafter's history: versioned, checksummed, written atomically, verified before use.

Layout (``_HEADER``, docs/drafting.md section 8.2): magic, version, payload length, SHA-256, then JSON meta and
int32 tokens. A truncated file, another magic or version, or a checksum or structure that does not match is
refused with a ValueError naming the problem; nothing is built from it.

Example::

    write_snapshot("h.snap", {"open_step": 1, "prompts": [("p", [3], [(0, [np.array([5, 6], np.int32)], None)])],
                              "recorded": [], "global": []})
    read_snapshot("h.snap")["prompts"][0][0] == "p"
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import struct

import numpy as np

from sglang_histospec.drafting.types import MAX_TOKEN_ID

MAGIC = b"HSPSNAP\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQ32s")
"""Little endian: magic (8 bytes, ``MAGIC``), version (u32, ``FORMAT_VERSION``), reserved (u32, 0), payload length
(u64), SHA-256 of the payload (32 bytes); then the payload = meta length (u64) | meta (UTF-8 JSON) | tokens (int32,
in the order the meta lists them)."""


def write_snapshot(path, state: dict) -> None:
    """Serialise ``state`` (the drafter's ``_export()`` shape, optional ``extra``: a small JSON dict kept as is) to
    ``path`` atomically (temp file + rename; the temp file is removed when writing fails)."""
    arrays: list[np.ndarray] = []
    prompts = []
    for pid, tail, visits in state["prompts"]:
        vs = []
        for step, responses, rewards in visits:
            arrays += responses
            vs.append({"step": int(step), "lengths": [len(r) for r in responses], "rewards": rewards})
        prompts.append({"id": pid, "tail": [int(t) for t in tail], "visits": vs})
    recorded = []
    for pid, items in state["recorded"]:
        arrays += [arr for _, arr in items]
        recorded.append(
            {"id": pid, "items": [{"tail": [int(t) for t in tail], "length": len(a)} for tail, a in items]}
        )
    glob = []
    for pid, step, seqs in state["global"]:
        arrays += seqs
        glob.append({"id": pid, "step": int(step), "lengths": [len(s) for s in seqs]})
    blob = np.concatenate([np.asarray(a, dtype="<i4") for a in arrays]) if arrays else np.zeros(0, "<i4")
    meta = json.dumps(
        {
            "open_step": int(state["open_step"]),
            "prompts": prompts,
            "recorded": recorded,
            "global": glob,
            "tokens": int(blob.size),
            "extra": dict(state.get("extra") or {}),
        },
        separators=(",", ":"),
    ).encode()
    payload = struct.pack("<Q", len(meta)) + meta + blob.astype("<i4").tobytes()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(payload), hashlib.sha256(payload).digest())
    tmp = f"{os.fspath(path)}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_snapshot(path) -> dict:
    """Read and verify a snapshot; returns the ``_export()`` shape. ValueError on any defect."""
    with open(path, "rb") as f:
        data = f.read()
    where = f"snapshot {os.fspath(path)!s}"
    if len(data) < _HEADER.size:
        raise ValueError(f"{where}: truncated ({len(data)} bytes, header needs {_HEADER.size})")
    magic, version, _, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"{where}: not a histospec snapshot (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise ValueError(f"{where}: format version {version}, this build reads version {FORMAT_VERSION}")
    payload = data[_HEADER.size :]
    if len(payload) < length:
        raise ValueError(f"{where}: truncated (payload {len(payload)} of {length} bytes)")
    if len(payload) > length:
        raise ValueError(f"{where}: corrupt ({len(payload) - length} unexpected trailing bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError(f"{where}: corrupt (checksum mismatch)")
    try:
        return _parse(payload)
    except (KeyError, TypeError, ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: corrupt structure ({exc})") from exc


def _parse(payload: bytes) -> dict:
    (meta_len,) = struct.unpack_from("<Q", payload)
    meta = json.loads(payload[8 : 8 + meta_len].decode())
    tokens = np.frombuffer(payload, dtype="<i4", offset=8 + meta_len).astype(np.int32)
    if tokens.size != meta["tokens"] or (tokens.size and int(tokens.min()) < 0):
        raise ValueError(f"token block holds {tokens.size} tokens, meta says {meta['tokens']}")
    pos = 0

    def take(n: int) -> np.ndarray:
        nonlocal pos
        if not isinstance(n, int) or n < 0 or pos + n > tokens.size:
            raise ValueError(f"sequence length {n!r} at offset {pos} exceeds the token block")
        out = tokens[pos : pos + n].copy()
        pos += n
        return out

    prompts = []
    for p in meta["prompts"]:
        visits = [(int(v["step"]), [take(n) for n in v["lengths"]], _rewards(v)) for v in p["visits"]]
        prompts.append((str(p["id"]), _tail(p["tail"]), visits))
    recorded = [
        (str(r["id"]), [([int(t) for t in it["tail"]], take(it["length"])) for it in r["items"]])
        for r in meta["recorded"]
    ]
    glob = [(str(g["id"]), int(g["step"]), [take(n) for n in g["lengths"]]) for g in meta["global"]]
    if pos != tokens.size:
        raise ValueError(f"{tokens.size - pos} tokens not referenced by the meta")
    extra = meta.get("extra") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"extra {extra!r:.80} is not an object")
    return {
        "open_step": int(meta["open_step"]),
        "prompts": prompts,
        "recorded": recorded,
        "global": glob,
        "extra": extra,
    }


def _tail(raw) -> list[int]:
    if not isinstance(raw, list) or any(
        isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < MAX_TOKEN_ID for t in raw
    ):
        raise ValueError(f"bad prompt tail {raw!r:.80}")
    return raw


def _rewards(visit: dict) -> list[float] | None:
    raw = visit["rewards"]
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != len(visit["lengths"]):
        raise ValueError(f"rewards {raw!r:.80} do not match {len(visit['lengths'])} responses")
    out = [float(r) for r in raw]
    if not all(math.isfinite(r) for r in out):
        raise ValueError(f"non-finite reward in {raw!r:.80}")
    return out
