"""Replay semantics: table-driven tiny traces with hand-computed tau / accepted / oracle, and properties."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_histospec.drafting.types import ROOT, Draft
from sglang_histospec.drafting.verify_cost import VerifyCostTable
from sglang_histospec.replay.drafters.prompt_lookup import PromptLookupDrafter
from sglang_histospec.replay.simulator import (
    BaseDrafter,
    NoneDrafter,
    ReplayConfig,
    accept_length,
    replay,
    sibling_order,
)
from sglang_histospec.trace.format import TraceRecord, TraceStep
from sglang_histospec.trace.kgrams import KeySet, kgram_keys, prefix_match, self_occurs


def chain(tokens):
    return Draft(list(tokens), [ROOT, *range(len(tokens) - 1)], [1.0] * len(tokens), match_len=1, source="history")


TREE = Draft([5, 7, 6, 8], [ROOT, ROOT, 0, 1], [0.6, 0.4, 0.6, 0.4])  # root->5->6, root->7->8

ACCEPT_TABLE = [
    # (draft, realized tokens, start, accepted)
    (Draft.empty(), [1, 2], 0, 0),
    (chain([1, 2, 3]), [1, 2, 3, 4], 0, 3),
    (chain([1, 2, 3]), [1, 2, 9, 4], 0, 2),
    (chain([1, 2, 3]), [0, 1, 2], 1, 2),  # start offset; the response ends after 2 tokens
    (TREE, [5, 6, 1], 0, 2),
    (TREE, [7, 8], 0, 2),
    (TREE, [7, 6], 0, 1),  # 6 is a child of 5, not of 7
    (TREE, [9], 0, 0),
    (Draft([4, 4], [ROOT, ROOT], [0.5, 0.5]), [4, 1], 0, 1),  # duplicate siblings: the first one is taken
]


@pytest.mark.parametrize(("draft", "target", "start", "expected"), ACCEPT_TABLE)
def test_accept_length(draft, target, start, expected):
    assert accept_length(draft, target, start) == expected


class Scripted(BaseDrafter):
    """Replays fixed drafts: ``script[(req_id, position)] = Draft``; empty otherwise."""

    name = "scripted"

    def __init__(self, script, sources=()):
        self.script, self.sources, self.pos = script, sources, {}

    def start(self, req_id, prompt_id, prompt):
        self.pos[req_id] = 0

    def extend(self, req_id, tokens):
        self.pos[req_id] += len(tokens)

    def draft(self, req_id, budget):
        d = self.script.get((req_id, self.pos[req_id]), Draft.empty())
        return Draft(d.token_ids[:budget], d.parents[:budget], d.probs[:budget]) if len(d) > budget else d


def one(prompt, response, step=0, pid="p", sample=0, reward=None):
    return TraceRecord(step, pid, sample, list(prompt), list(response), reward=reward)


# (name, steps, drafter factory, budget, expected dict)
CASES = [
    (
        "none",
        [TraceStep(0, [one([1], [2, 3, 4, 5, 6])])],
        NoneDrafter,
        4,
        dict(tokens=5, verify_steps=5, tau=1.0, drafted=0, accepted=0, accept_rate=0.0, oracle_tau=1.0),
    ),
    (
        # p=0 draft [2,3,9] accepts 2 + bonus -> p=3; p=3 draft [5,6,7] accepts 2 + bonus (end) -> p=6
        "scripted chain, bonus and end of response",
        [TraceStep(0, [one([1], [2, 3, 4, 5, 6, 7])])],
        lambda: Scripted({("0:p:0", 0): chain([2, 3, 9]), ("0:p:0", 3): chain([5, 6, 7])}),
        4,
        dict(tokens=6, verify_steps=2, tau=3.0, drafted=6, accepted=5, accept_rate=5 / 6),
    ),
    (
        # the draft covers the whole rest of the response: no bonus token past the end
        "scripted exact end",
        [TraceStep(0, [one([1], [2, 3])])],
        lambda: Scripted({("0:p:0", 0): chain([2, 3])}),
        4,
        dict(tokens=2, verify_steps=1, tau=2.0, drafted=2, accepted=2),
    ),
    (
        # budget truncates the scripted draft to 1 node
        "budget caps the draft",
        [TraceStep(0, [one([1], [2, 3, 4])])],
        lambda: Scripted({("0:p:0", 0): chain([2, 3, 4])}),
        1,
        dict(tokens=3, verify_steps=2, drafted=1, accepted=1),
    ),
    (
        # prompt lookup (n = 2): context [1,2,3,4] ends with (3,4), found only at the end -> empty, emits 1;
        # context ..4,1: (4,1) is new -> empty, emits 2; (1,2) occurs at 0 -> draft [3,4,1]: accepts 2, emits 3.
        # oracle (self, N=3): p=0: [1,2,3] occurs in the prompt -> emits 4; p=4: [9] nowhere -> 1. 2 steps.
        "prompt lookup",
        [TraceStep(0, [one([1, 2, 3, 4], [1, 2, 3, 4, 9])])],
        lambda: PromptLookupDrafter(min_n=2, max_n=2),
        3,
        dict(tokens=5, verify_steps=3, drafted=3, accepted=2, oracle_tau=2.5),
    ),
]


@pytest.mark.parametrize(("name", "steps", "factory", "budget", "expected"), CASES, ids=[c[0] for c in CASES])
def test_replay_table(name, steps, factory, budget, expected):
    res = replay(steps, factory(), ReplayConfig(budget=budget)).to_json()
    for key, value in expected.items():
        assert res[key] == pytest.approx(value), (key, res)


class HistoryOnly(BaseDrafter):
    """Declares history (window 1) as its source; drafts nothing (only the oracle matters here)."""

    name = "history-only"
    sources = ("history",)
    window = 1


def test_oracle_history_window_and_siblings():
    # step 0: no history -> 4 steps. step 1 (N=2): [5,6] from history -> p=3; [9] no -> p=4; [9] no -> 5: 3 steps.
    steps = [
        TraceStep(0, [one([1], [5, 6, 7, 8])]),
        TraceStep(1, [one([1], [5, 6, 7, 9, 9], step=1)]),
    ]
    res = replay(steps, HistoryOnly(), ReplayConfig(budget=2))
    assert (res.tokens, res.oracle_steps) == (9, 7)
    # window 1: step 2 sees step 1 only ([5,6,7,9,9]); its response [5,6,7,8] then needs [5,6] -> [7] ... = 2 steps
    # (p=0: [5,6] -> 3; p=3: [8] not in step 1 -> 4): 2 steps
    steps.append(TraceStep(2, [one([1], [5, 6, 7, 8], step=2)]))
    res = replay(steps, HistoryOnly(), ReplayConfig(budget=2))
    assert res.oracle_steps == 7 + 2


def test_oracle_all_history_and_other_sources():
    steps = [
        TraceStep(0, [one([0], [1, 2, 3, 4, 5, 6])]),
        TraceStep(1, [one([0], [9, 9, 9, 9], step=1)]),
        TraceStep(2, [one([0], [1, 2, 3, 4, 5, 6], step=2)]),
    ]
    windowed = replay(steps, HistoryOnly(), ReplayConfig(budget=8))
    full = replay(steps, HistoryOnly(), ReplayConfig(budget=8, oracle_all_history=True))
    assert windowed.per_step[2].oracle_steps == 6  # the window holds step 1 only
    assert full.per_step[2].oracle_steps == 1  # step 0 holds the whole response
    # self as the oracle's source, [9, 9, 9, 9] after prompt [0]: 9 is new (emit 1); at p=1 only [9] occurs in
    # the context [0, 9] (emit 2); at p=3 [9] occurs (emit the last token): 3 steps
    only_self = replay(steps, HistoryOnly(), ReplayConfig(budget=8, oracle_sources=("self",)))
    assert only_self.per_step[1].oracle_steps == 3
    with pytest.raises(ValueError, match="oracle_sources"):
        ReplayConfig(budget=1, oracle_sources=("nope",))


def test_sibling_order_and_siblings_source():
    recs = [one([1], [1, 2, 3, 4], sample=0), one([1], [1, 2], sample=1), one([1], [7, 8], sample=2)]
    assert [r.sample for r in sibling_order(recs)] == [1, 2, 0]

    class Sib(BaseDrafter):
        name = "sib"
        sources = ("siblings",)

    # order: sample 1 ([1,2]: nothing finished -> 2 steps), sample 2 ([7,8]: 2 steps), sample 0 ([1,2,3,4], N=4:
    # [1,2] from sample 1 -> p=3 -> [4] nowhere -> 2 steps)
    res = replay([TraceStep(0, recs)], Sib(), ReplayConfig(budget=4, schedule="sequential"))
    assert res.oracle_steps == 6


def test_est_speedup_and_timing_fields():
    steps = [TraceStep(0, [one([1], [2, 3, 4, 5, 6, 7])])]
    table = VerifyCostTable.from_dict({"batches": {"1": {"1": 1.0, "4": 1.5}}})
    d = Scripted({("0:p:0", 0): chain([2, 3, 9]), ("0:p:0", 3): chain([5, 6, 7])})
    res = replay(steps, d, ReplayConfig(budget=4, verify_cost=table))
    # two verify passes with 1 + 3 tokens each cost 1.5 each -> 6 tokens / 3.0
    assert res.est_speedup == pytest.approx(2.0)
    out = res.to_json()
    assert out["draft_us_p99"] >= out["draft_us_p50"] >= 0
    assert [s["tokens"] for s in out["per_step"]] == [6]


def test_replay_rejects_bad_input():
    with pytest.raises(ValueError, match="budget"):
        ReplayConfig(budget=-1)
    with pytest.raises(ValueError, match="strictly increasing"):
        replay([TraceStep(1), TraceStep(0)], NoneDrafter(), ReplayConfig(budget=1))

    class Greedy(BaseDrafter):
        name = "greedy"

        def draft(self, req_id, budget):
            return chain([1] * (budget + 1))

    with pytest.raises(RuntimeError, match="returned 3 nodes for budget 2"):
        replay([TraceStep(0, [one([1], [1, 1])])], Greedy(), ReplayConfig(budget=2))


# --- k-gram helpers and the verify-cost table ---


def _brute_prefix(seq, kmax, sources):
    out = []
    for p in range(len(seq)):
        best = 0
        for k in range(1, min(kmax, len(seq) - p) + 1):
            pat = seq[p : p + k]
            if any(pat == s[j : j + k] for s in sources for j in range(len(s) - k + 1)):
                best = k
        out.append(best)
    return out


def test_prefix_match_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        srcs = [rng.integers(0, 4, size=rng.integers(0, 12)).tolist() for _ in range(3)]
        seq = rng.integers(0, 4, size=rng.integers(1, 15)).tolist()
        ks = KeySet(5)
        for s in srcs:
            ks.add(s)
        assert prefix_match(seq, 5, [ks]).tolist() == _brute_prefix(seq, 5, srcs)


def test_self_occurs_matches_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(30):
        prefix = rng.integers(0, 3, size=rng.integers(0, 6)).tolist()
        seq = rng.integers(0, 3, size=rng.integers(1, 12)).tolist()
        got = self_occurs(prefix, seq, 4)
        for p in range(len(seq)):
            ctx = prefix + seq[:p]
            for k in range(1, 5):
                pat = seq[p : p + k]
                want = len(pat) == k and any(pat == ctx[j : j + k] for j in range(len(ctx) - k + 1))
                assert bool(got[k - 1, p]) == want


def test_kgram_keys_rows_and_validation():
    keys = kgram_keys([3, 4, 3, 4], 3)
    assert keys[1, 0] == keys[1, 2] and keys[0, 0] != keys[0, 1]
    with pytest.raises(ValueError, match="kmax"):
        kgram_keys([1], 0)


def test_verify_cost_table():
    t = VerifyCostTable.from_dict({"batches": {"1": {"1": 2.0, "3": 3.0}, "8": {"1": 1.0, "2": 4.0}}})
    assert t.cost(1, 1) == 1.0 and t.cost(2, 1) == pytest.approx(1.25)  # interpolated, normalised by cost(1)
    assert t.cost(5, 4) == pytest.approx(2.0)  # batch 4 -> row of batch 1; extrapolated linearly
    assert t.cost(2, 100) == 4.0  # largest listed batch <= 100
    d = VerifyCostTable.default()
    assert d.cost(1, 64) == 1.0 and d.cost(16, 1) < d.cost(16, 64)
    assert VerifyCostTable.from_dict(d.to_dict()).cost(9, 8) == pytest.approx(d.cost(9, 8))
    for bad in ({}, {"batches": {"x": {"1": 1}}}, {"batches": {"1": {"1": 2.0, "2": 1.0}}}):
        with pytest.raises(ValueError):
            VerifyCostTable.from_dict(bad)
