"""The lockstep schedule: rounds, running siblings as sources, --max-running, the oracle per round, --peer-reset."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.replay.drafters.registry import build_drafter
from sglang_histospec.replay.simulator import (
    NEVER,
    BaseDrafter,
    OpenRounds,
    Oracle,
    ReplayConfig,
    Request,
    admission_order,
    replay,
)
from sglang_histospec.trace.format import TraceRecord, TraceStep
from sglang_histospec.trace.synth import SynthConfig, generate


def chain(tokens):
    return Draft(list(tokens), [ROOT, *range(len(tokens) - 1)], [1.0] * len(tokens), match_len=1, source="siblings")


class SiblingCopy(BaseDrafter):
    """Drafts the continuation of a same-prompt request whose output so far extends this one's; scripted drafts
    (``script[(req_id, position)]``, copies of the prompt) take precedence. ``running=False`` reads finished
    siblings only."""

    name = "sibling-copy"
    sources = ("siblings", "self")

    def __init__(self, script=None, running=True):
        self.script, self.running = script or {}, running
        self.out, self.pid, self.finished = {}, {}, set()

    def start(self, req_id, prompt_id, prompt):
        self.out[req_id], self.pid[req_id] = [], prompt_id

    def extend(self, req_id, tokens):
        self.out[req_id].extend(tokens)

    def finish(self, req_id, response):
        self.finished.add(req_id)

    def draft(self, req_id, budget):
        mine = self.out[req_id]
        if (req_id, len(mine)) in self.script:
            return chain(self.script[(req_id, len(mine))][:budget])
        for other, toks in self.out.items():
            visible = other in self.finished or self.running
            same = self.pid[other] == self.pid[req_id] and other != req_id
            if visible and same and len(toks) > len(mine) and toks[: len(mine)] == mine:
                return chain(toks[len(mine) : len(mine) + budget])
        return Draft.empty()


def rec(sample, response, pid="p", step=0, prompt=(0,)):
    return TraceRecord(step, pid, sample, list(prompt), list(response))


# sample 0 is long and gets a scripted lead ([1, 2, 3] from the prompt at position 0); sample 1 shares its first
# four tokens.
LEAD = [rec(0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], prompt=(1, 2, 3)), rec(1, [1, 2, 3, 4, 20], prompt=(1, 2, 3))]
SCRIPT = {("0:p:0", 0): [1, 2, 3]}

# (name, running siblings readable, schedule, max_running, verify steps by sample, accepted nodes)
LOCKSTEP_CASES = [
    # round 0: sample 0 emits 4, sample 1 emits [1]; round 1: sample 1 copies sample 0's running [2, 3, 4] + 20
    ("lockstep reads a running sibling", True, "lockstep", None, {0: 9, 1: 2}, 6),
    # nothing finished until round 4: sample 1 emits one token per round
    ("lockstep, finished siblings only", False, "lockstep", None, {0: 9, 1: 5}, 3),
    # one at a time, sample 0 first: sample 1 copies the finished sample 0 ([1, 2, 3] + 4, then 20)
    ("lockstep, one at a time", True, "lockstep", 1, {0: 9, 1: 2}, 6),
    # shortest first: sample 1 has nobody to copy; sample 0's [20] from it is drafted and rejected
    ("sequential, shortest first", True, "sequential", None, {0: 9, 1: 5}, 3),
]


@pytest.mark.parametrize(
    ("name", "running", "schedule", "max_running", "steps", "accepted"),
    LOCKSTEP_CASES,
    ids=[c[0] for c in LOCKSTEP_CASES],
)
def test_lockstep_table(name, running, schedule, max_running, steps, accepted):
    seen = {}

    class Counting(SiblingCopy):
        def observe(self, req_id, drafted, acc):
            seen[req_id] = seen.get(req_id, 0) + 1

    cfg = ReplayConfig(budget=3, schedule=schedule, max_running=max_running)
    res = replay([TraceStep(0, list(LEAD))], Counting(SCRIPT, running), cfg)
    assert {int(k.rsplit(":", 1)[1]): v for k, v in seen.items()} == steps
    assert res.verify_steps == sum(steps.values()) and res.accepted == accepted
    assert res.oracle_steps <= res.verify_steps


def test_admission_order():
    recs = [rec(1, [1, 2], "b"), rec(0, [1, 2, 3], "a"), rec(0, [1], "b"), rec(1, [1], "a")]
    assert [(r.prompt_id, r.sample) for r in admission_order(recs, "lockstep")] == [
        ("b", 0), ("b", 1), ("a", 0), ("a", 1)
    ]  # fmt: skip
    assert [(r.prompt_id, r.sample) for r in admission_order(recs, "sequential")] == [
        ("b", 0), ("a", 1), ("b", 1), ("a", 0)
    ]  # fmt: skip


def test_schedule_config_is_validated():
    with pytest.raises(ValueError, match="schedule='parallel'"):
        ReplayConfig(budget=4, schedule="parallel")
    with pytest.raises(ValueError, match="max_running=2 needs schedule='lockstep'"):
        ReplayConfig(budget=4, schedule="sequential", max_running=2)
    with pytest.raises(ValueError, match="max_running=0"):
        ReplayConfig(budget=4, max_running=0)
    assert ReplayConfig(budget=4, schedule="sequential").width == 1
    assert ReplayConfig(budget=4).width is None


# --- lockstep one at a time equals sequential when the sibling order is the (prompt, sample) order ---


def _increasing_lengths(steps):
    """The synth trace with response i of a step (in (prompt, sample) order) cut to 8 + i tokens."""
    out = []
    for s in steps:
        recs = admission_order(s.records, "lockstep")
        out.append(TraceStep(s.step, [rec(r.sample, (r.response * 4)[: 8 + i], r.prompt_id, s.step, r.prompt)
                                      for i, r in enumerate(recs)]))  # fmt: skip
    return out


def _by_step(records):
    by = {}
    for r in records:
        by.setdefault(r.step, TraceStep(r.step)).records.append(r)
    return [by[s] for s in sorted(by)]


ORDERED = _increasing_lengths(
    _by_step(generate(SynthConfig(prompts=4, group_size=3, epochs=3, mean_len=30, vocab=200, seed=3)))
)
TIMING = ("draft_us_p50", "draft_us_p99", "wall_s", "tokens_per_min")
PEERS = [
    pytest.param("suffix", {}, marks=pytest.mark.skipif(
        importlib.util.find_spec("arctic_inference") is None, reason="needs `make install-peers`")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "opts"),
    [("histospec", {}), ("histospec", {"aimd": "paper"}), ("rhymerl", {}), ("prompt-lookup", {"pl_min": 2}), *PEERS],
)
def test_lockstep_one_at_a_time_equals_sequential(name, opts):
    assert [admission_order(s.records, "sequential") for s in ORDERED] == [
        admission_order(s.records, "lockstep") for s in ORDERED
    ]
    outs = []
    for cfg in (ReplayConfig(budget=6, schedule="sequential"), ReplayConfig(budget=6, max_running=1)):
        out = replay(ORDERED, build_drafter(name, 6, **opts), cfg).to_json()
        outs.append({k: v for k, v in out.items() if k not in TIMING})
    assert outs[0] == outs[1]
    assert outs[0]["accepted"] > 0


@pytest.mark.parametrize("max_running", [None, 1, 2, 5])
@pytest.mark.parametrize(("name", "opts"), [("histospec", {}), ("rhymerl", {}), *PEERS])
def test_lockstep_oracle_bounds_real_drafters(name, opts, max_running):
    res = replay(ORDERED, build_drafter(name, 6, **opts), ReplayConfig(budget=6, max_running=max_running))
    for s in res.per_step:
        assert s.oracle_steps <= s.verify_steps


# --- the oracle per round against a brute-force reference ---


def _visible(req, t):
    """prompt + the response tokens ``req`` had emitted before round ``t`` (None before it starts)."""
    if t < req.start_round:
        return None
    j = t - req.start_round  # rounds completed since the start
    n = req.ends[min(j, len(req.ends)) - 1] if j and req.ends else 0
    return req.rec.prompt + req.rec.response[:n]


def _occurs(pattern, seqs):
    k = len(pattern)
    return any(tuple(s[i : i + k]) == tuple(pattern) for s in seqs for i in range(len(s) - k + 1))


def brute_steps(reqs, i, budget, sources, live_global):
    """Oracle verify steps of request ``i`` by explicit substring search over each round's visible sequences."""
    me = reqs[i]
    resp, t, q, steps = me.rec.response, me.start_round, 0, 0
    while q < len(resp):
        seqs = []
        for j, other in enumerate(reqs):
            same = other.rec.prompt_id == me.rec.prompt_id
            if j != i and (("siblings" in sources and same) or ("global" in sources and live_global)):
                v = _visible(other, t)
                seqs += [v] if v is not None else []
        if "self" in sources:
            seqs.append(me.rec.prompt + resp[:q])
        reach = 0
        while reach < budget and q + reach < len(resp) and _occurs(resp[q : q + reach + 1], seqs):
            reach += 1
        q += reach + 1
        t += 1
        steps += 1
    return steps


_req = st.tuples(
    st.sampled_from(["a", "b"]),
    st.lists(st.integers(0, 2), min_size=0, max_size=8),
    st.integers(0, 3),
    st.integers(1, 3),
)


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(_req, min_size=1, max_size=4),
    sources=st.sampled_from([("siblings",), ("siblings", "self"), ("global",), ("self", "global")]),
    live=st.booleans(),
    budget=st.integers(1, 4),
)
def test_oracle_rounds_match_brute_force(reqs, sources, live, budget):
    built = []
    for sample, (pid, resp, start, stride) in enumerate(reqs):
        ends = list(range(stride, len(resp), stride)) + ([len(resp)] if resp else [])
        built.append(Request(f"r{sample}", rec(sample, resp, pid, prompt=(7,) if pid == "a" else (8, 7)), start, ends))
    got = Oracle(budget, sources, None, live).step(built)
    assert got == [brute_steps(built, i, budget, sources, live) for i in range(len(built))]


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=8), max_size=4),
    owner=st.integers(0, 4),
    probe=st.lists(st.integers(0, 6), max_size=6),
)
def test_open_rounds_matches_a_dict(groups, owner, probe):
    """OpenRounds = per key, the earliest round in a request other than the owner (a plain dict reference)."""
    keys = [np.array([k for k, _ in g], dtype=np.uint64) for g in groups]
    rounds = [np.array([r for _, r in g], dtype=np.int64) for g in groups]
    table = OpenRounds(keys, rounds, list(range(len(groups))))
    want = {}
    for w, g in enumerate(groups):
        for k, r in g:
            if w != owner:
                want[k] = min(want.get(k, NEVER), r)
    got = table.lookup(np.array(probe, dtype=np.uint64), owner).tolist()
    assert got == [want.get(k, NEVER) for k in probe]


# --- --peer-reset step: every step replays as if it were the trace's only one ---

PEER_RESET = [
    pytest.param("suffix", {}, marks=pytest.mark.skipif(
        importlib.util.find_spec("arctic_inference") is None, reason="needs `make install-peers`")),
    pytest.param("sglang-ngram", {"ngram_capacity": 100_000}, marks=[pytest.mark.slow, pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None, reason="needs `make install-peers`")]),
]  # fmt: skip


@pytest.mark.parametrize("schedule", ["lockstep", "sequential"])
@pytest.mark.parametrize(("name", "opts"), PEER_RESET)
def test_peer_reset_empties_the_peer_at_each_step(name, opts, schedule):
    cfg = ReplayConfig(budget=5, schedule=schedule)
    reset = replay(ORDERED, build_drafter(name, 5, peer_reset="step", **opts), cfg)
    kept = replay(ORDERED, build_drafter(name, 5, **opts), cfg)
    for s, got in zip(ORDERED, reset.per_step):
        alone = replay([s], build_drafter(name, 5, **opts), cfg).per_step[0]
        assert (got.verify_steps, got.oracle_steps) == (alone.verify_steps, alone.oracle_steps)
    assert kept.verify_steps < reset.verify_steps  # later epochs repeat earlier ones: the kept cache helps


@pytest.mark.parametrize("name", ["histospec", "rhymerl", "prompt-lookup", "none"])
def test_peer_reset_is_refused_for_non_peers(name):
    with pytest.raises(ValueError, match=f"applies to the peers .* not to '{name}'"):
        build_drafter(name, 4, peer_reset="step")
    with pytest.raises(ValueError, match="peer_reset='sometimes'"):
        build_drafter("suffix", 4, peer_reset="sometimes")
