"""The commit (engine/commit.py): tokens up to the finish, KV compaction, the drafter, the draft-size policy, results."""

from __future__ import annotations

import collections

import numpy as np
import torch

from sglang_histospec.engine import GenerateRequest, SamplingParams
from sglang_histospec.engine.commit import Commit, compaction_moves, emit
from sglang_histospec.engine.request import RequestState, tell_drafter
from sglang_histospec.engine.treebatch import TreeBatch, WalkResult


def _state(rid="a", max_new=8, return_logprob=False, prompt_id="p"):
    req = GenerateRequest(
        rid=rid,
        input_ids=[1, 5],
        prompt_id=prompt_id,
        return_logprob=return_logprob,
        sampling=SamplingParams(max_new_tokens=max_new),
    )
    return RequestState(req=req, rng=np.random.default_rng(0), tokens=[1, 5], stop_ids=frozenset({2}))


class Recorder:
    """Fake drafter, policy and KV cache: records every call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def _commit(drafter, policy, cache, stats=None, speculate=True, adaptive=False):
    stats = collections.Counter() if stats is None else stats
    return Commit(
        drafter,
        policy,
        cache,
        torch.device("cpu"),
        stats,
        speculate=speculate,
        adaptive=adaptive,
        record_responses=True,
    )


def test_emit_stops_at_stop_token_and_length():
    st = _state(max_new=8)
    assert emit(st, WalkResult([1, 2], [7, 2, 9], [0, 1, 2]), [-0.1, -0.2, -0.3]) == 2
    assert st.output == [7, 2] and st.tokens == [1, 5, 7, 2] and st.logprobs == [-0.1, -0.2]
    assert st.finish == {"type": "stop", "matched": 2}
    st = _state(max_new=2)
    assert emit(st, WalkResult([1, 2], [7, 8, 9], [0, 1, 2]), None) == 2
    assert st.output == [7, 8] and st.logprobs == [] and st.finish == {"type": "length", "length": 2}
    st = _state()
    assert emit(st, WalkResult([], [7], [0]), None) == 1 and st.finish is None


def test_compaction_moves():
    assert compaction_moves(10, [2, 5]) == [(12, 11), (15, 12)]
    assert compaction_moves(4, [1, 2]) == []  # a chain already in place
    assert compaction_moves(4, []) == []


def test_step_commits_tokens_cache_and_drafter():
    """Request 0 accepts tree nodes 2 then 3 (moved next to its root), request 1 stops; the drafter hears nothing
    (it is told lazily, ``tell_drafter``)."""
    drafter, policy, cache, stats = Recorder(), Recorder(), Recorder(), collections.Counter()
    commit = _commit(drafter, policy, cache, stats, adaptive=True)
    a, b = _state("a", return_logprob=True), _state("b")
    tb = TreeBatch.build([([0, 7, 8, 9], [-1, 0, 0, 2]), None], root_tokens=[5, 5])
    walks = [WalkResult([2, 3], [8, 9, 4], [0, 2, 3]), WalkResult([], [2], [4])]
    emitted = commit.step([a, b], tb, walks, [-1.0, -2.0, -3.0, -4.0], base=np.array([1, 1]))
    assert emitted == 4 and a.output == [8, 9, 4] and a.logprobs == [-1.0, -2.0, -3.0] and b.output == [2]
    assert a.kv_len == 1 + 1 + 2 and b.finish is not None and b.kv_len == 0
    assert (a.verify_ct, a.draft_ct, a.accept_ct) == (1, 3, 2)
    [(name, slot, src, dst)] = cache.calls
    assert name == "move_tokens" and slot.tolist() == [0, 0] and src.tolist() == [3, 4] and dst.tolist() == [2, 3]
    assert drafter.calls == []
    assert policy.calls == [("request_step", "a", 2, 2), ("request_step", "b", 0, 0)]  # tree depth, accepted length
    assert dict(stats) == {
        "verify_steps": 2,
        "draft_tokens": 3,
        "accepted_tokens": 2,
        "generated_tokens": 4,
        "step_tokens": 4,
    }


def test_step_without_speculation():
    drafter, policy, cache = Recorder(), Recorder(), Recorder()
    off = _commit(drafter, policy, cache, speculate=False)
    st = _state()
    off.step([st], TreeBatch.build([None], [5]), [WalkResult([], [7], [0])], None, base=np.array([1]))
    assert drafter.calls == [] and policy.calls == [] and cache.calls == [] and st.kv_len == 2


def test_the_drafter_is_told_each_token_once_when_asked():
    """Steps decoded plainly cost the drafter nothing; telling it catches up every request at once."""
    drafter = Recorder()
    a, b, c = _state("a"), _state("b"), _state("c")
    a.output, b.output = [7, 8], [9]
    tell_drafter(drafter, [a, b, c])
    a.output.append(3)
    tell_drafter(drafter, [a, b, c])
    tell_drafter(drafter, [a, b, c])  # nothing new
    assert drafter.calls == [("extend_batch", ["a", "b"], [[7, 8], [9]]), ("extend_batch", ["a"], [[3]])]
    assert (a.told, b.told, c.told) == (3, 1, 0)


def test_finish_records_or_aborts():
    drafter, policy, stats = Recorder(), Recorder(), collections.Counter()
    commit = _commit(drafter, policy, None, stats)
    done, aborted, anonymous = _state("a"), _state("b", return_logprob=True), _state("c", prompt_id=None)
    for st, finish in ((done, {"type": "length", "length": 1}), (aborted, {"type": "abort", "message": "x"})):
        st.output, st.finish, st.draft_ct = [7], finish, 2
    anonymous.finish = {"type": "stop", "matched": 2}
    res = commit.finish(done)
    assert (res.rid, res.output_ids, res.completion_tokens, res.output_logprobs) == ("a", [7], 1, None)
    assert commit.finish(aborted).output_logprobs == []
    commit.finish(anonymous)
    # the finished request's drafts learn from its whole response first (one that never drafted is not told)
    assert drafter.calls == [("extend_batch", ["a"], [[7]]), ("finish", "a", [7]), ("abort", "b"), ("abort", "c")]
    assert policy.calls == [("request_done", "a"), ("request_done", "b"), ("request_done", "c")]
    assert stats == {"requests_finished": 2, "requests_aborted": 1}
    drafter.calls.clear()
    undrafted = _state("d")
    undrafted.output, undrafted.finish = [7, 8], {"type": "length", "length": 2}
    commit.finish(undrafted)
    assert drafter.calls == [("finish", "d", [7, 8])]
