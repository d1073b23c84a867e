"""The test harness's torch stand-ins for SGLang's CPU ``sgl_kernel`` ops, checked against hand-worked cases.

Loaded under a private module name, so nothing named ``sgl_kernel`` ever enters this process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

STUB = Path(__file__).resolve().parents[1] / "sglang_harness" / "stub_kernel" / "sgl_kernel"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kernel = _load("histospec_test_stub_sgl_kernel", STUB / "__init__.py")
speculative = _load("histospec_test_stub_sgl_kernel_speculative", STUB / "speculative.py")


def _mask_from_parents(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parents[j]
    return mask


# parents (node 0 = root), expected depth, first child, next sibling
TREES = [
    ([-1, 0, 0, 1], [0, 1, 1, 2], [1, 3, -1, -1], [-1, 2, -1, -1]),
    ([-1, 0, 1, 2], [0, 1, 2, 3], [1, 2, 3, -1], [-1, -1, -1, -1]),
    ([-1, 0, 0, 0], [0, 1, 1, 1], [1, -1, -1, -1], [-1, 2, 3, -1]),
]


@pytest.mark.parametrize(("parents", "depth", "child", "sibling"), TREES)
def test_reconstruct_indices_from_tree_mask(parents, depth, child, sibling):
    n, bs = len(parents), 2
    mask = torch.cat([_mask_from_parents(parents).reshape(-1)] * bs)
    seq_lens = torch.tensor([5, 9])
    positions = torch.empty(bs * n, dtype=torch.int64)
    index, next_token, next_sibling = (torch.empty(bs, n, dtype=torch.int64) for _ in range(3))
    speculative.reconstruct_indices_from_tree_mask(mask, seq_lens, positions, index, next_token, next_sibling, bs, n)
    assert positions.tolist() == [5 + d for d in depth] + [9 + d for d in depth]
    assert index.tolist() == [list(range(n)), list(range(n, 2 * n))]
    assert next_token.tolist() == [child, child]
    assert next_sibling.tolist() == [sibling, sibling]


def test_verify_tree_greedy_follows_the_matching_branch():
    # Tree: root(0) -> 7(1) -> 9(3), root -> 8(2). Target argmax after root is 8 (the second child), after 8 is 4.
    candidates = torch.tensor([[3, 7, 8, 9]])
    index = torch.tensor([[0, 1, 2, 3]])
    next_token = torch.tensor([[1, 3, -1, -1]])
    next_sibling = torch.tensor([[-1, 2, -1, -1]])
    target = torch.tensor([[8, 9, 4, 5]])
    predicts = torch.full((4,), -7, dtype=torch.int32)
    accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    accept_num = torch.empty(1, dtype=torch.int32)
    kernel.verify_tree_greedy_cpu(
        predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, target
    )
    assert accept_num.tolist() == [1]
    assert accept_index.tolist() == [[0, 2, -1, -1]]
    assert predicts[0].item() == 8 and predicts[2].item() == 4  # accepted draft 8, then the bonus token 4


def test_verify_tree_greedy_rejects_everything():
    candidates = torch.tensor([[3, 7, 8]])
    predicts = torch.zeros(3, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.empty(1, dtype=torch.int32)
    kernel.verify_tree_greedy_cpu(
        predicts,
        accept_index,
        accept_num,
        candidates,
        torch.tensor([[0, 1, 2]]),
        torch.tensor([[1, -1, -1]]),
        torch.tensor([[-1, 2, -1]]),
        torch.tensor([[5, 1, 1]]),
    )
    assert accept_num.tolist() == [0] and accept_index.tolist() == [[0, -1, -1]] and predicts[0].item() == 5


def test_cache_loc_ops_round_trip():
    req_to_token = torch.zeros(3, 10, dtype=torch.int32)
    pool = torch.tensor([2, 0])
    start, end = torch.tensor([1, 4]), torch.tensor([3, 7])
    locs = torch.tensor([11, 12, 21, 22, 23])
    kernel.assign_req_to_token_pool_cpu(pool, req_to_token, start, end, locs, 10)
    assert req_to_token[2, 1:3].tolist() == [11, 12] and req_to_token[0, 4:7].tolist() == [21, 22, 23]
    out = torch.empty(5, dtype=torch.int64)
    kernel.assign_extend_cache_locs_cpu(pool, req_to_token, start, end, out, 10)
    assert out.tolist() == [11, 12, 21, 22, 23]


def test_fill_accept_and_bonus():
    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1]])
    out_cache_loc = torch.tensor([100, 101, 102, 103, 104, 105])
    accepted = torch.full((4,), -1, dtype=torch.int64)
    kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accepted)
    assert accepted.tolist() == [100, 102, 103, -1]
    bonus = torch.empty(2, dtype=torch.int64)
    kernel.fill_bonus_tokens_cpu(torch.tensor([5, 6, 0, 7, 0, 0]), torch.tensor([2, 1]), bonus, 3)
    assert bonus.tolist() == [6, 7]


def test_copy_all_layer_kv_cache_reads_before_writing():
    buffers = [torch.arange(12, dtype=torch.float32).reshape(6, 2), torch.arange(18, dtype=torch.int16).reshape(6, 3)]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers], dtype=torch.int64)
    # Swap rows 1 and 2 and copy row 0 to row 5: overlapping sources and targets.
    kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([2, 1, 5]), torch.tensor([1, 2, 0]))
    for buf, old in zip(buffers, before):
        assert torch.equal(buf[2], old[1]) and torch.equal(buf[1], old[2]) and torch.equal(buf[5], old[0])
        assert torch.equal(buf[3], old[3])


def test_unimplemented_ops_fail_loudly():
    with pytest.raises(NotImplementedError, match="rmsnorm"):
        kernel.rmsnorm(torch.zeros(1))
    assert kernel.IS_HISTOSPEC_TEST_STAND_IN
