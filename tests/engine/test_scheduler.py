"""The scheduler (engine/scheduler.py): FIFO admission into free slots, contiguous slots after retiring."""

from __future__ import annotations

import numpy as np

from sglang_histospec.engine import GenerateRequest, SamplingParams
from sglang_histospec.engine.scheduler import Scheduler


class FakeCache:
    def __init__(self):
        self.moves = []

    def move_slot(self, src, dst, length):
        self.moves.append((src, dst, length))


def _req(rid, **sampling):
    return GenerateRequest(rid=rid, input_ids=[1, 5, 6], sampling=SamplingParams(**sampling))


def test_admits_in_order_up_to_max_running():
    s = Scheduler(max_running=2, seed=0, eos_ids=frozenset({2}))
    for rid in "abc":
        s.add(_req(rid))
    assert [st.req.rid for st in s.admit()] == ["a", "b"]
    assert [r.rid for r in s.waiting] == ["c"] and s.rids == {"a", "b", "c"}
    assert s.admit() == []
    st = s.running[0]
    assert st.tokens == [1, 5, 6] and st.pending == 2 and st.kv_len == 0


def test_stop_ids_and_seeds():
    s = Scheduler(max_running=4, seed=7, eos_ids=frozenset({2}))
    s.add(_req("a", stop_token_ids=[9]))
    s.add(_req("b", stop_token_ids=[9], ignore_eos=True))
    s.add(_req("c", seed=3, seed_offset=5))
    a, b, c = s.admit()
    assert a.stop_ids == {2, 9} and b.stop_ids == {9}
    assert a.rng.random() == np.random.default_rng([7, 0]).random()  # unseeded: the engine seed and the counter
    assert b.rng.random() == np.random.default_rng([7, 1]).random()
    assert c.rng.random() == np.random.default_rng(3).random() and c.skip == 5


def test_retire_keeps_slots_contiguous():
    """Finished requests leave, highest slot first; the last running request fills each freed slot."""
    s = Scheduler(max_running=4, seed=0, eos_ids=frozenset())
    for rid in "abcd":
        s.add(_req(rid))
    s.admit()
    for st, kv in zip(s.running, (3, 4, 5, 6)):
        st.kv_len = kv
    s.running[0].finish = {"type": "stop", "matched": 2}
    s.running[2].finish = {"type": "length", "length": 1}
    cache = FakeCache()
    assert [st.req.rid for st in s.retire(cache)] == ["c", "a"]
    assert cache.moves == [(3, 2, 6), (2, 0, 6)]  # d into c's slot, then d (now last) into a's
    assert [st.req.rid for st in s.running] == ["d", "b"] and s.rids == {"b", "d"}


def test_drop_waiting_and_find_running():
    s = Scheduler(max_running=1, seed=0, eos_ids=frozenset())
    s.add(_req("a"))
    s.add(_req("b"))
    s.admit()
    assert s.drop_waiting("a") is None and s.drop_waiting("b").rid == "b" and "b" not in s.rids
    assert s.find_running("a") is s.running[0]
    s.running[0].finish = {"type": "abort", "message": "aborted"}
    assert s.find_running("a") is None  # already finished
    assert s.max_pending() == 2
