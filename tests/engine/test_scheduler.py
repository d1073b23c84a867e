"""The scheduler (engine/scheduler.py): FIFO and group-spreading admission into free slots, seeds fixed by arrival,
contiguous slots after retiring."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_histospec.engine import GenerateRequest, SamplingParams
from sglang_histospec.engine.scheduler import Scheduler


class FakeCache:
    def __init__(self):
        self.moves = []

    def move_slot(self, src, dst, length):
        self.moves.append((src, dst, length))


def _req(rid, prompt_id=None, **sampling):
    return GenerateRequest(rid=rid, input_ids=[1, 5, 6], sampling=SamplingParams(**sampling), prompt_id=prompt_id)


def _finish(s, rids):
    for st in s.running:
        if st.req.rid in rids:
            st.finish = {"type": "length", "length": 1}
    return [st.req.rid for st in s.retire(FakeCache())]


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


# (admission, max_running, requests as rid:prompt id, rounds of rids finished) -> rids admitted per round
GROUPS = [f"{p}{k}:{p}" for p in "abc" for k in range(3)]  # a0 a1 a2 b0 ... c2, three groups of three
ADMISSION_CASES = [
    ("fifo", 3, GROUPS, [["a0"], ["a1", "a2"]], [["a0", "a1", "a2"], ["b0"], ["b1", "b2"]]),
    # one of each group first; a freed slot takes its own group's next sample (its sibling just finished)
    ("groups", 3, GROUPS, [["a0"], ["b0", "c0"]], [["a0", "b0", "c0"], ["a1"], ["b1", "c1"]]),
    # two slots a group once every group runs: the earliest of the groups with the fewest running
    ("groups", 4, GROUPS, [["b0"], ["a0", "a1"]], [["a0", "b0", "c0", "a1"], ["b1"], ["a2", "b2"]]),
    # requests without a prompt id are groups of one: arrival order
    ("groups", 2, ["x:", "y:", "a0:a", "a1:a", "z:"], [["x"], ["y"]], [["x", "y"], ["a0"], ["z"]]),
]


@pytest.mark.parametrize("admission,max_running,requests,finished,expected", ADMISSION_CASES)
def test_admission_order(admission, max_running, requests, finished, expected):
    s = Scheduler(max_running=max_running, seed=0, eos_ids=frozenset(), admission=admission)
    for spec in requests:
        rid, pid = spec.split(":")
        s.add(_req(rid, prompt_id=pid or None))
    rounds = [[st.req.rid for st in s.admit()]]
    for rids in finished:
        _finish(s, set(rids))
        rounds.append([st.req.rid for st in s.admit()])
    assert rounds == expected


def test_unseeded_streams_follow_arrival_not_admission():
    """An unseeded request draws the stream of its arrival number, in any admission order (dropped ones count)."""
    s = Scheduler(max_running=1, seed=7, eos_ids=frozenset(), admission="groups")
    for rid, pid in [("a0", "a"), ("gone", None), ("a1", "a"), ("b0", "b")]:
        s.add(_req(rid, prompt_id=pid))
    assert s.drop_waiting("gone").rid == "gone"
    order = []
    while s.waiting:
        [st] = s.admit()
        order.append((st.req.rid, st.rng.random()))
        _finish(s, {st.req.rid})
    arrival = {"a0": 0, "a1": 2, "b0": 3}
    assert [rid for rid, _ in order] == ["a0", "a1", "b0"]
    assert all(u == np.random.default_rng([7, arrival[rid]]).random() for rid, u in order)


def test_bad_admission():
    with pytest.raises(ValueError, match="admission='lifo'"):
        Scheduler(max_running=1, seed=0, eos_ids=frozenset(), admission="lifo")
