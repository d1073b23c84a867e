"""Seeded rollout requests: the demo's and the recorder's hash seeding, the engine benchmark's index seeding."""

from __future__ import annotations

import pytest

from sglang_histospec.trace.seeding import epoch_requests, index_seed, request_seed


def test_request_seed_is_stable_and_distinct():
    assert request_seed(0, 1, "arith-0001", 2) == request_seed(0, 1, "arith-0001", 2)
    seeds = {request_seed(0, e, f"arith-{p:04d}", k) for e in range(3) for p in range(4) for k in range(4)}
    assert len(seeds) == 48 and all(0 <= s < 2**31 for s in seeds)


PROMPTS = [("arith-0000", [5, 6]), ("arith-0001", [7])]


def test_epoch_requests_hash_seeding_is_the_demos():
    reqs = epoch_requests(PROMPTS, 2, 1.0, 8, 0, 1, return_logprob=True)
    assert [r.rid for r in reqs] == ["e1-arith-0000-0", "e1-arith-0000-1", "e1-arith-0001-0", "e1-arith-0001-1"]
    assert [r.sampling.seed for r in reqs] == [request_seed(0, 1, pid, k) for pid, _ in PROMPTS for k in range(2)]
    assert reqs[3].sampling.seed == 1137737926  # the traces of docs/data/ were sampled with these seeds
    assert all(r.return_logprob and r.sampling.max_new_tokens == 8 for r in reqs)
    assert [r.input_ids for r in reqs] == [[5, 6], [5, 6], [7], [7]] and reqs[2].prompt_id == "arith-0001"


def test_epoch_requests_index_seeding_is_the_benchmarks():
    reqs = epoch_requests(PROMPTS, 2, 1.0, 8, 2, 3, seeding="index")
    # seed * 1_000_003 + epoch * 10_007 + prompt index * 101 + sample: the seeds of docs/results.md's engine figures
    assert [r.sampling.seed for r in reqs] == [2030027, 2030028, 2030128, 2030129]
    assert index_seed(2, 3, 1, 2) == 2030130 and not any(r.return_logprob for r in reqs)
    assert [r.rid for r in reqs] == [r.rid.replace("e1-", "e3-") for r in epoch_requests(PROMPTS, 2, 1.0, 8, 0, 1)]


def test_epoch_requests_rejects_an_unknown_seeding():
    with pytest.raises(ValueError, match="seeding='sha'"):
        epoch_requests(PROMPTS, 1, 1.0, 8, 0, 0, seeding="sha")
