"""A minimal forward pass over Hugging Face Llama / Qwen2 / Qwen3 weights with an explicit KV cache and tree masks.

The HF modules provide the weights, the norms, the MLPs and the rotary embedding (so every RoPE variant HF
supports is honoured); this module only re-implements the attention so that any set of query tokens (a prefill
chunk, a decode token or a whole draft tree) can attend to any set of cached keys through a boolean mask, with
explicit positions. Logits match ``model(input_ids).logits`` of the HF model (tested).

KV layout: one tensor ``[num_layers, 2, slots, num_kv_heads, capacity, head_dim]``. A batch always occupies a
contiguous range of slots; batch row ``b`` is slot ``slot_start + b``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_histospec.engine.types import SUPPORTED_ARCHITECTURES


def check_architecture(hf_config) -> str:
    """Return the architecture name, or raise ValueError for one the engine cannot run.

    Example: a ``LlamaConfig()`` gives ``"LlamaForCausalLM"``; a GPT-2 config raises ValueError.
    """
    archs = list(getattr(hf_config, "architectures", None) or [])
    model_type = getattr(hf_config, "model_type", "")
    by_type = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), by_type.get(model_type))
    if arch is None:
        raise ValueError(
            f"architecture {archs or model_type!r} is not supported by the torch engine; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} (use the SGLang backend for other models)"
        )
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("sliding-window attention (use_sliding_window=True) is not supported by the torch engine")
    return arch


class KVCache:
    """Per-slot key/value storage that grows on demand (slots and capacity double, up to their limits)."""

    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, max_slots: int, max_capacity: int, device, dtype
    ):
        self.shape_tail = (num_layers, num_kv_heads, head_dim)
        self.max_slots = max_slots
        self.max_capacity = max_capacity
        self.device = device
        self.dtype = dtype
        self.data: torch.Tensor | None = None  # [L, 2, slots, Hkv, capacity, D]

    @property
    def slots(self) -> int:
        return 0 if self.data is None else self.data.shape[2]

    @property
    def capacity(self) -> int:
        return 0 if self.data is None else self.data.shape[4]

    def ensure(self, slots: int, capacity: int) -> None:
        """Make room for ``slots`` slots of ``capacity`` tokens each, keeping the contents."""
        if slots > self.max_slots or capacity > self.max_capacity:
            raise ValueError(f"KV cache request ({slots} slots, {capacity} tokens) beyond the limits")
        if slots <= self.slots and capacity <= self.capacity:
            return
        new_slots = min(self.max_slots, max(slots, 2 * self.slots, 1))
        new_cap = min(self.max_capacity, max(capacity, 2 * self.capacity, 64))
        if slots <= self.slots:
            new_slots = self.slots
        if capacity <= self.capacity:
            new_cap = self.capacity
        layers, heads, dim = self.shape_tail
        data = torch.zeros((layers, 2, new_slots, heads, new_cap, dim), device=self.device, dtype=self.dtype)
        if self.data is not None:
            data[:, :, : self.slots, :, : self.capacity] = self.data
        self.data = data

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached tokens of slot ``src`` into slot ``dst``."""
        if length > 0 and src != dst:
            self.data[:, :, dst, :, :length] = self.data[:, :, src, :, :length]

    def move_tokens(self, slot_idx: torch.Tensor, src_pos: torch.Tensor, dst_pos: torch.Tensor) -> None:
        """``cache[slot_idx[m], dst_pos[m]] = cache[slot_idx[m], src_pos[m]]`` for every m (all layers, K and V).

        The sources are read before anything is written. Shapes: ``[M]`` int64 each.
        """
        if slot_idx.numel():
            self.data[:, :, slot_idx, :, dst_pos] = self.data[:, :, slot_idx, :, src_pos]

    def clear(self) -> None:
        self.data = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


PACK_MIN_BYTES = 64 << 20
"""With ``packed=None`` the linears are packed when their weights hold at least this many bytes: a model whose
weights stream from memory at every pass (packed, few-row passes run faster), not one that stays in the CPU's
caches (there a packed call's fixed cost of some microseconds outweighs it)."""

PACK_MIN_ROWS = 3
"""Passes of fewer rows keep ``F.linear`` (faster there even for weights streamed from memory)."""


def _can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear runs here (CPU, float32, torch built with oneDNN) and matches ``F.linear``."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        w, x = torch.arange(32.0).view(8, 4).sin(), torch.arange(12.0).view(3, 4).cos()  # no draw from torch's RNG
        got = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w), None, "none", [], "")
        return bool(torch.allclose(got, F.linear(x, w), atol=1e-5))
    except (AttributeError, RuntimeError):  # an op missing from this build
        return False


class TreeForward:
    """Runs the decoder of an HF Llama/Qwen2/Qwen3 model on arbitrary token sets with a boolean attention mask.

    Example::

        fwd = TreeForward(hf_model)
        cache = fwd.new_cache(max_slots=4, max_capacity=256)
        cache.ensure(1, 3)
        ids = torch.tensor([[5, 6, 7]]); pos = torch.arange(3)[None]
        mask = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]       # [B, 1, N, T]
        hidden = fwd.forward(ids, pos, pos, mask, cache, slot_start=0)     # [1, 3, hidden]
        logits = fwd.logits(hidden)                                        # == hf_model(ids).logits

    ``packed`` (CPU float32 only; None = when the linear weights hold at least ``PACK_MIN_BYTES``): every linear of
    the decoder and the LM head also keeps a oneDNN-packed copy of its weight, used for passes of at least
    ``PACK_MIN_ROWS`` rows. Then a row's result does not depend on how many rows share such a pass, and few-row
    passes (decode steps of a small batch, verify trees) of a model streamed from memory run faster than with
    ``F.linear``; the copies cost the weights' memory once more. Call ``repack()`` after changing the weights in
    place.
    """

    def __init__(self, hf_model, packed: bool | None = None) -> None:
        self.model = hf_model
        self.arch = check_architecture(hf_model.config)
        cfg = hf_model.config
        self.decoder = hf_model.model
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_layers = cfg.num_hidden_layers
        self.has_qk_norm = hasattr(self.decoder.layers[0].self_attn, "q_norm")
        self._linears = [self.model.lm_head]
        for layer in self.decoder.layers:
            a, m = layer.self_attn, layer.mlp
            self._linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
        if packed is None:
            packed = sum(mod.weight.numel() * mod.weight.element_size() for mod in self._linears) >= PACK_MIN_BYTES
        self.packed = packed and _can_pack(self.device, self.dtype)
        self._packed: dict[torch.nn.Module, torch.Tensor] = {}  # linear module -> its packed weight
        self.repack()

    def repack(self) -> None:
        """Rebuild the packed weight copies from the modules' weights (a no-op when not ``packed``)."""
        if self.packed:
            with torch.no_grad():
                self._packed = {mod: torch.ops.mkldnn._reorder_linear_weight(mod.weight) for mod in self._linears}

    def _linear(self, mod: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        """``mod(x)``, through the packed weight for ``PACK_MIN_ROWS`` rows or more."""
        w = self._packed.get(mod)
        rows = x.numel() // x.shape[-1]
        if w is None or rows < PACK_MIN_ROWS:
            return mod(x)
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]), w, mod.bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])

    def _mlp(self, mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # [..., hidden]
        """The gated MLP of Llama, Qwen2 and Qwen3 (``down(act(gate(x)) * up(x))``) through ``_linear``."""
        return self._linear(mlp.down_proj, mlp.act_fn(self._linear(mlp.gate_proj, x)) * self._linear(mlp.up_proj, x))

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    def new_cache(self, max_slots: int, max_capacity: int) -> KVCache:
        return KVCache(
            self.num_layers, self.num_kv_heads, self.head_dim, max_slots, max_capacity, self.device, self.dtype
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, N] int64
        positions: torch.Tensor,  # [B, N] int64 rotary positions
        write_pos: torch.Tensor,  # [B, N] int64 cache index each token's K/V is written to; -1 = padding (not written)
        mask: torch.Tensor,  # [B, 1, N, T] bool, True = may attend; T = cached keys read (indices 0..T-1)
        cache: KVCache,
        slot_start: int,
    ) -> torch.Tensor:  # [B, N, hidden] after the final norm
        bsz, n = input_ids.shape
        t = mask.shape[-1]
        if mask.dtype == torch.bool:  # additive form once per pass, not once per layer inside the attention
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        # Only the R real tokens (write_pos >= 0) go through the projections and MLPs, packed as [1, R, H]; the
        # attention alone uses the padded [B, N] layout. Trees of a step differ in size, so padding every request
        # to the largest one would multiply the dense work.
        real = write_pos >= 0  # [B, N] bool
        b_idx, n_idx = real.nonzero(as_tuple=True)
        slot_idx = b_idx + slot_start
        pos_idx = write_pos[b_idx, n_idx]
        rows = len(b_idx)
        wide = self._wide_rows(real)
        hidden = self.decoder.embed_tokens(input_ids[b_idx, n_idx])[None]  # [1, R, H]
        cos, sin = self.decoder.rotary_emb(hidden, positions[b_idx, n_idx][None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # [R, 1, D]
        width = self.num_heads * self.head_dim
        padded = hidden.new_zeros((bsz, n, self.num_heads, self.head_dim))
        for layer_no, layer in enumerate(self.decoder.layers):
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            q = self._linear(attn.q_proj, x).view(rows, self.num_heads, self.head_dim)
            k = self._linear(attn.k_proj, x).view(rows, self.num_kv_heads, self.head_dim)
            v = self._linear(attn.v_proj, x).view(rows, self.num_kv_heads, self.head_dim)
            if self.has_qk_norm:
                q = attn.q_norm(q)
                k = attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kv = cache.data[layer_no]  # [2, slots, Hkv, C, D]
            kv[0, slot_idx, :, pos_idx] = k
            kv[1, slot_idx, :, pos_idx] = v
            keys = kv[0, slot_start : slot_start + bsz, :, :t]
            values = kv[1, slot_start : slot_start + bsz, :, :t]
            padded[b_idx, n_idx] = q
            out = self._attend(padded, keys, values, mask, attn.scaling, wide)[b_idx, n_idx].reshape(1, rows, width)
            hidden = residual + self._linear(attn.o_proj, out)
            residual = hidden
            hidden = residual + self._mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        out = hidden.new_zeros((bsz, n, hidden.shape[-1]))
        out[b_idx, n_idx] = self.decoder.norm(hidden)[0]
        return out

    @staticmethod
    def _wide_rows(real: torch.Tensor) -> torch.Tensor | None:  # [B, N] bool real columns -> [M] int64 or None
        """The requests with more than one query column, when attending them apart pays (see ``_attend``): at
        most a quarter of the batch, padded to at least 4 columns; else None (one padded pass is as cheap)."""
        bsz, width = real.shape
        if width < 4 or bsz < 4:
            return None
        wide = (real.sum(dim=1) > 1).nonzero(as_tuple=True)[0]
        return wide if 0 < len(wide) <= bsz // 4 else None

    def _attend(
        self,
        q: torch.Tensor,  # [B, N, H, D] queries, padded
        keys: torch.Tensor,  # [B, Hkv, T, D]
        values: torch.Tensor,  # [B, Hkv, T, D]
        mask: torch.Tensor,  # [B, 1, N, T] additive
        scale: float,
        wide: torch.Tensor | None,  # [M] int64 requests with more than one query column (``_wide_rows``)
    ) -> torch.Tensor:  # [B, N, H, D]
        """Attention of every query column. A step where a few requests carry a tree pads every request to the
        largest tree, and the attention's cost grows with that width; so the requests with one column (no draft)
        attend in a pass of width 1 and only the ``wide`` ones in a padded pass of their own (their keys gathered).
        Both give the same values as one padded pass, up to float rounding."""
        gqa = self.num_heads != self.num_kv_heads

        def sdpa(qq, kk, vv, mm):
            return F.scaled_dot_product_attention(
                qq.transpose(1, 2), kk, vv, attn_mask=mm, scale=scale, enable_gqa=gqa
            )

        if wide is None:
            return sdpa(q, keys, values, mask).transpose(1, 2)
        out = sdpa(q[:, :1], keys, values, mask[:, :, :1]).transpose(1, 2).expand(q.shape).clone()
        out[wide] = sdpa(q[wide], keys[wide], values[wide], mask[wide]).transpose(1, 2)
        return out

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., vocab] float32
        return self._linear(self.model.lm_head, hidden).float()
