"""The engine's own forward (tree masks, explicit KV cache) against the Hugging Face forward."""

from __future__ import annotations

import pytest
import torch

from sglang_histospec.engine.model import TreeForward, _can_pack, check_architecture
from tests.helpers.tiny import make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def hf_model(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param, vocab_size=64, seed=1)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_prefill_matches_hf(hf_model):
    fwd = TreeForward(hf_model)
    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    cache = fwd.new_cache(max_slots=4, max_capacity=64)
    cache.ensure(3, 12)
    pos = torch.arange(12).repeat(3, 1)
    mask = torch.ones(12, 12, dtype=torch.bool).tril().repeat(3, 1, 1, 1)
    ours = fwd.logits(fwd.forward(ids, pos, pos, mask, cache, slot_start=0))
    with torch.no_grad():
        ref = hf_model(ids).logits
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_tree_verify_matches_hf_per_path(hf_model):
    """Prefill a prefix, then verify a tree in one pass: each node's logits equal HF's on its root path."""
    fwd = TreeForward(hf_model)
    prefix = [1, 7, 9, 11, 5]
    #        root  a   b   a.c  a.d  b.e  a.c.f
    tokens = [5, 20, 21, 30, 31, 32, 40]
    parents = [-1, 0, 0, 1, 1, 2, 3]
    n, p = len(tokens), len(prefix) - 1
    cache = fwd.new_cache(max_slots=2, max_capacity=64)
    cache.ensure(1, p + n)
    pre = torch.tensor([prefix[:-1]])
    pos = torch.arange(p)[None]
    fwd.forward(pre, pos, pos, torch.ones(p, p, dtype=torch.bool).tril()[None, None], cache, slot_start=0)
    depth = [0] * n
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if parents[i] >= 0:
            depth[i] = depth[parents[i]] + 1
            anc[i] = anc[parents[i]]
        anc[i, i] = True
    mask = torch.cat([torch.ones(n, p, dtype=torch.bool), anc], dim=1)[None, None]
    logits = fwd.logits(
        fwd.forward(
            torch.tensor([tokens]),
            torch.tensor([[p + d for d in depth]]),
            torch.arange(p, p + n)[None],
            mask,
            cache,
            slot_start=0,
        )
    )[0]
    for i in range(n):
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        seq = prefix[:-1] + path[::-1]
        with torch.no_grad():
            ref = hf_model(torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(logits[i], ref, atol=1e-5, rtol=1e-5)


def test_unsupported_architecture_is_named():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="not supported by the torch engine"):
        check_architecture(GPT2Config())


@pytest.mark.parametrize("wide_rows", [[2], [0, 5], [0, 1, 3, 6]])
def test_requests_without_a_tree_attend_apart_with_the_same_result(hf_model, monkeypatch, wide_rows):
    """A verify pass where some requests carry a chain and the others only their root: the split attention
    (``TreeForward._attend``) gives the hidden states of one padded pass."""
    fwd = TreeForward(hf_model)
    bsz, p, n = 8, 5, 4

    def run() -> torch.Tensor:
        cache = fwd.new_cache(max_slots=bsz, max_capacity=32)
        cache.ensure(bsz, p + n)
        ctx = torch.randint(0, 64, (bsz, p), generator=torch.Generator().manual_seed(4))
        pos = torch.arange(p).repeat(bsz, 1)
        fwd.forward(ctx, pos, pos, torch.ones(p, p, dtype=torch.bool).tril().repeat(bsz, 1, 1, 1), cache, 0)
        ids = torch.randint(0, 64, (bsz, n), generator=torch.Generator().manual_seed(5))
        qpos = (p + torch.arange(n)).repeat(bsz, 1)
        write = qpos.clone()
        mask = torch.zeros(bsz, 1, n, p + n, dtype=torch.bool)
        mask[:, :, :, :p] = True
        for b in range(bsz):
            cols = n if b in wide_rows else 1
            write[b, cols:] = -1
            qpos[b, cols:] = p
            mask[b, 0, :, p] = True  # padding sees the past and the root
            mask[b, 0, :cols, p : p + cols] = torch.ones(cols, cols, dtype=torch.bool).tril()
        return fwd.forward(ids, qpos, write, mask, cache, slot_start=0)

    split = run()
    monkeypatch.setattr(TreeForward, "_wide_rows", staticmethod(lambda real: None))
    padded = run()
    for b in range(bsz):
        cols = n if b in wide_rows else 1
        torch.testing.assert_close(split[b, :cols], padded[b, :cols], atol=1e-5, rtol=1e-5)


needs_packing = pytest.mark.skipif(
    not _can_pack(torch.device("cpu"), torch.float32), reason="this torch build has no oneDNN packed linear"
)


@needs_packing
def test_packed_linears_give_the_logits_of_the_plain_ones(hf_model):
    packed, plain = TreeForward(hf_model, packed=True), TreeForward(hf_model, packed=False)
    assert packed.packed and not plain.packed and not TreeForward(hf_model).packed  # a tiny model: not by default
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(9).repeat(2, 1)
    mask = torch.ones(9, 9, dtype=torch.bool).tril().repeat(2, 1, 1, 1)
    out = []
    for fwd in (packed, plain):
        cache = fwd.new_cache(max_slots=2, max_capacity=16)
        cache.ensure(2, 9)
        out.append(fwd.logits(fwd.forward(ids, pos, pos, mask, cache, slot_start=0)))
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=1e-5)


@needs_packing
@pytest.mark.parametrize("rows", [3, 7, 16, 33])
def test_a_packed_rows_result_does_not_depend_on_the_other_rows_of_its_pass(hf_model, rows):
    fwd = TreeForward(hf_model, packed=True)
    for mod in (hf_model.model.layers[0].mlp.down_proj, hf_model.model.layers[0].self_attn.q_proj, hf_model.lm_head):
        x = torch.randn(40, mod.in_features, generator=torch.Generator().manual_seed(rows))
        with torch.inference_mode():
            assert torch.equal(fwd._linear(mod, x[:rows])[:2], fwd._linear(mod, x)[:2])
