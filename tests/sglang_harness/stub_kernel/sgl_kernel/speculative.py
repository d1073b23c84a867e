"""Test-only stand-in for ``sgl_kernel.speculative`` (see the package docstring)."""

from __future__ import annotations

import torch


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # bool [bs * n * n], mask[b, i, j] = j is an ancestor of i or j == i
    verified_seq_len: torch.Tensor,  # [bs]
    positions: torch.Tensor,  # int64 [bs * n] (output)
    retrieve_index: torch.Tensor,  # int64 [bs, n] (output)
    retrieve_next_token: torch.Tensor,  # int64 [bs, n] (output) lowest-numbered child or -1
    retrieve_next_sibling: torch.Tensor,  # int64 [bs, n] (output) next node with the same parent or -1
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Tree links and positions from each request's ancestor-or-self mask.

    Example: n = 3, root with two children -> depth [0, 1, 1], next_token [1, -1, -1], next_sibling [-1, 2, -1].
    """
    n = draft_token_num
    if batch_size == 0:
        return
    mask = tree_mask[: batch_size * n * n].reshape(batch_size, n, n).to(torch.bool)
    order = torch.arange(n)
    strict = mask & (order[None, :] < order[:, None])[None]  # [bs, n, n] strict ancestors
    depth = strict.sum(-1)
    positions[: batch_size * n] = (depth + verified_seq_len[:batch_size].to(torch.int64)[:, None]).reshape(-1)
    retrieve_index[:batch_size] = torch.arange(batch_size * n, dtype=torch.int64).reshape(batch_size, n)
    parents = torch.where(strict.any(-1), (strict * order).argmax(-1), torch.full_like(depth, -1)).tolist()
    next_token = [[-1] * n for _ in range(batch_size)]
    next_sibling = [[-1] * n for _ in range(batch_size)]
    for b in range(batch_size):
        first_child: dict[int, int] = {}
        for i in reversed(range(n)):
            next_token[b][i] = first_child.get(i, -1)
            parent = parents[b][i]
            if parent >= 0:
                next_sibling[b][i] = first_child.get(parent, -1)
                first_child[parent] = i
    retrieve_next_token[:batch_size] = torch.tensor(next_token, dtype=torch.int64)
    retrieve_next_sibling[:batch_size] = torch.tensor(next_sibling, dtype=torch.int64)
