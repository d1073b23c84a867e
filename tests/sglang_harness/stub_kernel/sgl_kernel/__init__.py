"""Test-only stand-in for SGLang's CPU kernel package ``sgl_kernel`` (never product code).

SGLang 0.5.23 in CPU mode (``SGLANG_USE_CPU_ENGINE=1``) imports ``sgl_kernel``, whose CPU build exists only as a
source build for AVX-512/AMX Xeons. On a machine without it, the test harness puts this directory on the
``PYTHONPATH`` of the test's SGLang server (only when no real ``sgl_kernel`` is importable), so that:

* every name SGLang merely imports resolves to a placeholder (calling it raises ``NotImplementedError``),
* the seven CPU ops that the NGRAM speculative path calls are computed in plain PyTorch, following the documented
  semantics in ``docs/sglang.md`` (correctness, not speed: they are Python loops).

Example: ``fill_bonus_tokens_cpu(torch.tensor([5, 6, 7, 8]), torch.tensor([2, 1]), out := torch.empty(2,
dtype=torch.long), 2)`` leaves ``out == [6, 7]`` (the last accepted token of each request).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import sys
import types

import numpy as np
import torch

IS_HISTOSPEC_TEST_STAND_IN = True


class _Placeholder:
    """Stands for an op or value the stand-in does not provide: any attribute resolves, calling it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{self._name} is not implemented by the histospec test stand-in")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<histospec stand-in placeholder sgl_kernel.{self._name}>"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder(name)


class _StubSubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolve any ``sgl_kernel.<sub>`` that is not a file here to a module of placeholders."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        if fullname == __name__ + ".speculative":
            return None  # a real file of the stand-in
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        prefix = spec.name.split(".", 1)[1]

        def module_getattr(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(f"{prefix}.{name}")

        module.__getattr__ = module_getattr  # type: ignore[attr-defined]
        return module

    def exec_module(self, module):
        return None


sys.meta_path.append(_StubSubmoduleFinder())


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,  # int64 [num_buffers] raw base addresses
    strides: torch.Tensor,  # int64 [num_buffers] row size in bytes
    tgt_loc: torch.Tensor,  # int [n]
    src_loc: torch.Tensor,  # int [n]
) -> None:
    """Copy row ``src_loc[i]`` to row ``tgt_loc[i]`` in every KV buffer (all reads before any write)."""
    if src_loc.numel() == 0:
        return
    src = src_loc.to(torch.int64).numpy()
    tgt = tgt_loc.to(torch.int64).numpy()
    rows = int(max(src.max(), tgt.max())) + 1
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(base)
        view = np.ctypeslib.as_array(raw).reshape(rows, stride)
        view[tgt] = view[src]  # fancy indexing on the right makes a copy first


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,  # [bs]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len]
    start_offset: torch.Tensor,  # [bs]
    end_offset: torch.Tensor,  # [bs]
    out_cache_loc: torch.Tensor,  # [sum(end - start)]
    pool_len: int,
) -> None:
    """Write consecutive slices of ``out_cache_loc`` into ``req_to_token[req, start:end]``."""
    pos = 0
    for req, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[req, start:end] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,  # [bs]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len]
    start_offset: torch.Tensor,  # [bs]
    end_offset: torch.Tensor,  # [bs]
    out_cache_loc: torch.Tensor,  # [sum(end - start)] (output)
    pool_len: int,
) -> None:
    """Gather ``req_to_token[req, start:end]`` of every request into consecutive slots of ``out_cache_loc``."""
    pos = 0
    for req, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        out_cache_loc[pos : pos + n] = req_to_token[req, start:end].to(out_cache_loc.dtype)
        pos += n


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,  # [bs, k] with -1 for rejected slots
    out_cache_loc: torch.Tensor,  # [bs * n]
    accept_out_cache_loc: torch.Tensor,  # [num_accepted] (output)
) -> None:
    """Stream compaction: ``out_cache_loc[i]`` for every accepted index ``i`` (row-major), in order."""
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].to(torch.int64)
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,  # [bs * accept_stride] (or [bs, accept_stride])
    accept_lens: torch.Tensor,  # [bs], bonus token included
    bonus_tokens: torch.Tensor,  # [bs] (output)
    accept_stride: int,
) -> None:
    """``bonus_tokens[b]`` = the last accepted token of request ``b``."""
    flat = accept_tokens.reshape(-1)
    bs = accept_lens.numel()
    idx = torch.arange(bs, dtype=torch.int64) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens[:bs] = flat[idx].to(bonus_tokens.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,  # [bs * n] (output) token emitted at each accepted node
    accept_index: torch.Tensor,  # [bs, k] (output) global node index of the accepted path, -1 padded
    accept_token_num: torch.Tensor,  # [bs] (output) number of accepted drafts (bonus excluded)
    candidates: torch.Tensor,  # [bs, n] draft tokens
    retrive_index: torch.Tensor,  # [bs, n] global index of each node
    retrive_next_token: torch.Tensor,  # [bs, n] first child, -1 if leaf
    retrive_next_sibling: torch.Tensor,  # [bs, n] next sibling, -1 if none
    target_predict: torch.Tensor,  # [bs, n] target argmax after each node
) -> None:
    """Greedy tree acceptance: follow the child whose token equals the target's argmax at the last accepted node."""
    bs, k = accept_index.shape
    cand = candidates.tolist()
    index = retrive_index.tolist()
    child = retrive_next_token.tolist()
    sibling = retrive_next_sibling.tolist()
    target = target_predict.tolist()
    for b in range(bs):
        last = index[b][0]
        accept_index[b, 0] = last
        node = 0
        accepted = 0
        for _ in range(k - 1):
            nxt = child[b][node]
            found = -1
            while nxt != -1:
                if cand[b][nxt] == target[b][node]:
                    found = nxt
                    break
                nxt = sibling[b][nxt]
            if found == -1:
                break
            predicts[last] = cand[b][found]
            accepted += 1
            node = found
            last = index[b][found]
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[b][node]
