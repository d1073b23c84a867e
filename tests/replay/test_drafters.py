"""Replay properties with the real drafters: none, prompt lookup, HistoSpec (tree/chain/sources), RhymeRL preset,
and the peers (ArcticInference suffix, SGLang NGRAM) when installed."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.replay.drafters.peers import PeerUnavailable
from sglang_histospec.replay.drafters.registry import build_drafter
from sglang_histospec.replay.simulator import ReplayConfig, replay
from sglang_histospec.trace.format import TraceRecord, TraceStep
from sglang_histospec.trace.synth import SynthConfig, generate


def steps_of(records):
    by = {}
    for r in records:
        by.setdefault(r.step, TraceStep(r.step)).records.append(r)
    return [by[s] for s in sorted(by)]


SYNTH = steps_of(generate(SynthConfig(prompts=6, group_size=4, epochs=3, mean_len=60, vocab=400, seed=5)))
TIMING = ("draft_us_p50", "draft_us_p99", "wall_s", "tokens_per_min")


def stable(res):
    out = res.to_json()
    for k in TIMING:
        out.pop(k)
    return out


def test_none_gives_tau_one():
    res = replay(SYNTH, build_drafter("none", 8), ReplayConfig(budget=8))
    assert res.tau == 1.0 and res.drafted == 0 and res.verify_steps == res.tokens


@pytest.mark.parametrize("budget", [1, 4, 8])
@pytest.mark.parametrize("opts", [{}, {"tree": False}, {"sources": "history"}, {"backend": "python"}])
def test_identical_history_gives_the_maximum(budget, opts):
    """A response equal to the previous epoch's: every verify step accepts the whole budget (bounded by the end)."""
    resp = list(range(100, 131))  # 31 distinct tokens: nothing repeats inside the response
    steps = [TraceStep(s, [TraceRecord(s, "p", 0, [1, 2, 3, 4, 5], resp)]) for s in (0, 1)]
    res = replay(steps, build_drafter("histospec", budget, **opts), ReplayConfig(budget=budget))
    second = res.per_step[1]
    want = -(-len(resp) // (budget + 1))  # ceil: budget + 1 tokens per verify step
    assert second.verify_steps == want == second.oracle_steps
    assert res.per_step[0].verify_steps == len(resp)  # no history, no repetition: one token per step


DRAFTERS = [
    ("none", {}),
    ("prompt-lookup", {"pl_min": 1, "pl_max": 3}),
    ("histospec", {}),
    ("histospec", {"tree": False, "window": 2}),
    ("histospec", {"sources": "history,siblings,self,global", "window": 3, "min_match": 2}),
    ("histospec", {"aimd": "paper", "reward_weight": 1.0}),
    ("rhymerl", {}),
]


@pytest.mark.parametrize(("name", "opts"), DRAFTERS)
@pytest.mark.parametrize("budget", [2, 8])
def test_oracle_bounds_every_drafter(name, opts, budget):
    res = replay(SYNTH, build_drafter(name, budget, **opts), ReplayConfig(budget=budget))
    assert res.oracle_steps <= res.verify_steps
    for s in res.per_step:  # per step too (the sources only grow between responses)
        assert s.oracle_steps <= s.verify_steps
    assert res.accepted <= res.drafted
    assert res.tokens == sum(len(r.response) for st in SYNTH for r in st.records)
    # every verify step emits its accepted nodes plus a bonus token, except at most one per response (the end)
    assert res.verify_steps + res.accepted - res.responses <= res.tokens <= res.verify_steps + res.accepted


def test_history_helps_on_repeating_epochs():
    hs = replay(SYNTH, build_drafter("histospec", 8), ReplayConfig(budget=8))
    pl = replay(SYNTH, build_drafter("prompt-lookup", 8), ReplayConfig(budget=8))
    assert hs.per_step[-1].tokens / hs.per_step[-1].verify_steps > 1.5
    assert hs.tau > pl.tau


@pytest.mark.parametrize("budget", [1, 4, 16])
def test_histospec_chain_with_released_knobs_equals_rhymerl(budget):
    released = dict(
        tree=False, window=1, min_match=4, max_match=7, prompt_tail=5, min_prob=0.1, recency_decay=1.0,
        reward_weight=0.0, use_frequency=True, sources="history", aimd="released",
    )  # fmt: skip
    a = replay(SYNTH, build_drafter("histospec", budget, **released), ReplayConfig(budget=budget))
    b = replay(SYNTH, build_drafter("rhymerl", budget), ReplayConfig(budget=budget))
    sa, sb = stable(a), stable(b)
    assert sa.pop("drafter") == "histospec" and sb.pop("drafter") == "rhymerl"
    assert sa == sb
    assert a.accepted > 0


def test_unknown_drafter_and_bad_knobs():
    with pytest.raises(ValueError, match="unknown drafter 'eagle'"):
        build_drafter("eagle", 8)
    with pytest.raises(ValueError, match="sources"):
        build_drafter("histospec", 8, sources="history,bogus")
    with pytest.raises(ValueError, match="min_n"):
        build_drafter("prompt-lookup", 8, pl_min=3, pl_max=2)


@pytest.mark.parametrize(("name", "module"), [("suffix", "arctic_inference"), ("sglang-ngram", "sglang")])
def test_peer_refused_with_make_target_when_missing(monkeypatch, name, module):
    import sys

    for mod in list(sys.modules):
        if mod == module or mod.startswith(module + "."):
            monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, module, None)  # import of the package fails
    from sglang_histospec.replay.drafters import sglang_ngram

    monkeypatch.setattr(sglang_ngram, "_LOADED", [])  # as before any import
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n.split(".")[0] == module else _spec(n))
    with pytest.raises(PeerUnavailable, match="make install-peers"):
        build_drafter(name, 4)


_real_find_spec = importlib.util.find_spec


def _spec(name):
    return _real_find_spec(name)


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is None, reason="needs `make install-peers`")
@pytest.mark.parametrize("budget", [2, 8])
def test_suffix_peer_runs_and_is_bounded_by_its_oracle(budget):
    res = replay(SYNTH, build_drafter("suffix", budget), ReplayConfig(budget=budget))
    assert res.accepted > 0 and res.oracle_steps <= res.verify_steps
    for s in res.per_step:
        assert s.oracle_steps <= s.verify_steps


@pytest.fixture
def restore_sglang_modules():
    """The light import registers bare ``sglang`` package objects; drop them afterwards for other tests."""
    import sys

    before = {m for m in sys.modules if m == "sglang" or m.startswith("sglang.")}
    yield
    for m in [m for m in sys.modules if (m == "sglang" or m.startswith("sglang.")) and m not in before]:
        del sys.modules[m]


@pytest.mark.slow  # the first use JIT-compiles SGLang's C++ (about 50 s)
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs `make install-peers`")
def test_sglang_ngram_peer_runs_and_is_bounded_by_its_oracle(restore_sglang_modules):
    budget = 7
    res = replay(SYNTH, build_drafter("sglang-ngram", budget, ngram_capacity=200_000), ReplayConfig(budget=budget))
    assert res.accepted > 0 and res.oracle_steps <= res.verify_steps
    for s in res.per_step:
        assert s.oracle_steps <= s.verify_steps


# --- property: the oracle bounds every drafter on random tiny traces (small vocabulary: many repeats) ---

_tokens = st.lists(st.integers(0, 3), min_size=0, max_size=12)
_record = st.tuples(st.integers(0, 2), st.sampled_from(["a", "b"]), _tokens)
_CONFIGS = [
    ("histospec", {}),
    ("histospec", {"tree": False, "sources": "history,siblings,self,global", "window": 2, "min_match": 1}),
    ("histospec", {"aimd": "paper", "prompt_tail": 0, "sources": "siblings,self"}),
    ("rhymerl", {}),
    ("prompt-lookup", {"pl_min": 1, "pl_max": 2}),
]


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(_record, min_size=1, max_size=10),
    config=st.sampled_from(_CONFIGS),
    budget=st.integers(1, 5),
    schedule=st.sampled_from([("sequential", None), ("lockstep", None), ("lockstep", 2)]),
)
def test_oracle_bounds_drafters_on_random_traces(records, config, budget, schedule):
    recs, count = [], {}
    for step, pid, resp in records:
        sample = count.get((step, pid), 0)
        count[(step, pid)] = sample + 1
        recs.append(TraceRecord(step, pid, sample, [1, 2] if pid == "a" else [3], resp))
    name, opts = config
    cfg = ReplayConfig(budget=budget, schedule=schedule[0], max_running=schedule[1])
    res = replay(steps_of(recs), build_drafter(name, budget, **opts), cfg)
    assert res.tokens == sum(len(r.response) for r in recs)
    for s in res.per_step:
        assert s.oracle_steps <= s.verify_steps <= s.tokens
