"""Test-only TARGET_VERIFY support for SGLang's ``torch_native`` attention backend (see sitecustomize.py).

For a verify batch every request b has a committed prefix of L = seq_lens[b] tokens and N draft tokens (a tree).
The N query rows attend to the whole prefix and to their own ancestors in the tree (including themselves):
mask[b] = [ones(N, L) | tree_mask[b]] of shape [N, L + N], tree_mask given compactly as bs * N * N booleans.

Example: L = 2, N = 2, tree = chain -> rows [1 1 1 0] and [1 1 1 1].
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention


def _verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache: bool) -> torch.Tensor:
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    cache_loc = forward_batch.out_cache_loc
    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(cache_loc, backend.swa_out_cache_loc), k, v)
    spec = forward_batch.spec_info
    n = int(spec.draft_token_num)
    q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)  # [bs * N, H, D]
    out = q.new_empty((q_.shape[0], layer.tp_q_head_num, layer.v_head_dim))
    k_cache = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = backend.token_to_kv_pool.get_value_buffer(layer.layer_id)
    req_to_token = backend.req_to_token_pool.req_to_token
    bs = forward_batch.req_pool_indices.shape[0]
    tree = spec.custom_mask.reshape(-1)[: bs * n * n].reshape(bs, n, n).to(torch.bool)
    seq_lens = forward_batch.seq_lens.tolist()
    use_gqa = layer.tp_q_head_num != layer.tp_k_head_num
    for b in range(bs):
        prefix = int(seq_lens[b])
        slots = req_to_token[forward_batch.req_pool_indices[b], : prefix + n].to(torch.int64)
        key = k_cache[slots].movedim(0, 1)  # [Hkv, L + N, D]
        value = v_cache[slots].movedim(0, 1)
        query = q_[b * n : (b + 1) * n].movedim(0, 1)  # [H, N, D]
        if key.dtype != query.dtype:
            key, value = key.to(query.dtype), value.to(query.dtype)
        mask = torch.cat([torch.ones((n, prefix), dtype=torch.bool, device=tree.device), tree[b]], dim=1)
        res = scaled_dot_product_attention(
            query.unsqueeze(0),
            key.unsqueeze(0),
            value.unsqueeze(0),
            attn_mask=mask,
            scale=layer.scaling,
            enable_gqa=use_gqa,
        )
        out[b * n : (b + 1) * n] = res.squeeze(0).movedim(0, 1)
    return out.reshape(q_.shape[0], layer.tp_q_head_num * layer.v_head_dim)


def install(module) -> None:
    cls = module.TorchNativeAttnBackend
    if getattr(cls, "_histospec_target_verify", False):
        return
    original = cls.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return _verify_attention(self, q, k, v, layer, forward_batch, save_kv_cache)
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    cls.forward_extend = forward_extend
    cls._histospec_target_verify = True
