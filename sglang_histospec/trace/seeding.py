"""Seeded rollout requests: one epoch's requests with a sampling seed per (epoch, prompt, sample).

The traces of ``docs/data/`` (``trace/record.py``), the demo's rollouts and ``histospec bench engine`` build their
requests with :func:`epoch_requests`, so runs with and without drafting sample with the same seeds.

Example::

    reqs = epoch_requests([("arith-0000", [5, 6])], group_size=2, temperature=1.0, max_new_tokens=8, seed=0, epoch=1)
    [r.rid for r in reqs]   # ["e1-arith-0000-0", "e1-arith-0000-1"]
"""

from __future__ import annotations

import hashlib


def request_seed(seed: int, epoch: int, prompt_id: str, sample: int) -> int:
    """A sampling seed in [0, 2**31) that depends only on its arguments. Example: stable across runs."""
    digest = hashlib.sha256(f"{seed}/{epoch}/{prompt_id}/{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def index_seed(seed: int, epoch: int, index: int, sample: int) -> int:
    """The seed of ``histospec bench engine``: linear in the prompt's position ``index`` in the prompt set.
    Example: ``index_seed(2, 3, 1, 2) == 2 * 1_000_003 + 3 * 10_007 + 1 * 101 + 2 == 2030130``."""
    return seed * 1_000_003 + epoch * 10_007 + index * 101 + sample


SEEDINGS = ("hash", "index")
"""How ``epoch_requests`` seeds a request. ``hash``: :func:`request_seed` of the prompt id (the demo's rollouts,
``trace/record.py`` and the traces in ``docs/data/`` were sampled with it); ``index``: :func:`index_seed` of the
prompt's position (``histospec bench engine``: the figures of ``docs/results.md`` were measured with it). Both
stay: either one alone would change the other's committed figures."""


def epoch_requests(prompts: list[tuple[str, list[int]]], group_size: int, temperature: float, max_new_tokens: int,
                   seed: int, epoch: int, return_logprob: bool = False, seeding: str = "hash") -> list:  # fmt: skip
    """One epoch's requests: ``group_size`` samples of every (prompt id, token ids), rid ``e{epoch}-{pid}-{k}``,
    each seeded by ``request_seed(seed, epoch, pid, k)`` (``seeding="hash"``) or ``index_seed(seed, epoch, i, k)``
    for the i-th prompt (``seeding="index"``); see ``SEEDINGS``."""
    from sglang_histospec.engine import GenerateRequest, SamplingParams

    if seeding not in SEEDINGS:
        raise ValueError(f"seeding={seeding!r}: expected one of {SEEDINGS}")

    def seed_of(i: int, pid: str, k: int) -> int:
        return request_seed(seed, epoch, pid, k) if seeding == "hash" else index_seed(seed, epoch, i, k)

    return [
        GenerateRequest(
            rid=f"e{epoch}-{pid}-{k}",
            input_ids=ids,
            sampling=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed_of(i, pid, k)),
            prompt_id=pid,
            return_logprob=return_logprob,
        )
        for i, (pid, ids) in enumerate(prompts)
        for k in range(group_size)
    ]
