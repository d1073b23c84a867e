"""``DrafterConfig.draft_threads``: the native ``draft_batch`` spread over a thread pool returns the drafts (and, for
the anchor scorer, learns the counts) of one thread, in the same order; the setting is validated at the boundary."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.native import NativeIndex  # CI builds the extension from source
from sglang_histospec.drafting.native_anchors import NativeAnchorIndex
from sglang_histospec.drafting.types import COUNTS_SOURCES, SOURCES, WEIGHT_ONE
from tests.helpers.threads import run_threads

REQS = tuple(f"r{i}" for i in range(12))
PROMPTS = ("p0", "p1")


def make(scorer: str, threads: int, sources: tuple[str, ...], min_match: int, max_match: int):
    if scorer == "anchors":
        return NativeAnchorIndex(
            min_match=min_match, max_match=max_match, prompt_tail=1, sources=sources, draft_threads=threads
        )
    sources = tuple(s for s in sources if s in COUNTS_SOURCES) or ("history",)
    return NativeIndex(
        min_match=min_match,
        max_match=max_match,
        tree=True,
        min_prob=0.1,
        use_frequency=True,
        sources=sources,
        draft_threads=threads,
    )


def random_workload(seed: int, scorer: str, threads: int = 4) -> int:
    """A seeded random call sequence on a 1-thread and a ``threads``-thread index: every ``draft_batch`` (the whole
    live batch, budgets mixed, some ids twice) must return the same drafts in the same order; the anchor scorer's
    learnt counts must agree after every step. Returns the drafts compared."""
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 30])
    sources = tuple(s for s in SOURCES if rng.random() < 0.7) or ("history",)
    min_match, max_match = rng.choice([1, 2]), rng.choice([4, 32])
    one, many = (make(scorer, t, sources, min_match, max_match) for t in (1, threads))
    assert (one.draft_threads(), many.draft_threads()) == (1, threads)

    def seq(lo: int = 1, hi: int = 80) -> list[int]:
        return [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]

    live: dict[str, int] = {}
    compared = 0
    for step in range(60):
        if step % 15 == 0:
            for p in PROMPTS:
                hist = [np.asarray(seq(), dtype=np.int32) for _ in range(3)]
                for idx in (one, many):
                    idx.set_history(p, hist, [WEIGHT_ONE, WEIGHT_ONE // 2, WEIGHT_ONE // 4])
        for rid in REQS:
            if rid not in live and rng.random() < 0.3:
                prompt_id, prompt, live[rid] = rng.choice((*PROMPTS, None)), seq(1, 6), 0
                for idx in (one, many):
                    idx.start(rid, prompt_id, prompt)
        ids = [r for r in REQS if r in live] + [r for r in REQS if r in live and rng.random() < 0.1]
        budgets = [rng.choice([0, 1, 4, 8, 16, 40]) for _ in ids]
        got = many.draft_batch(ids, budgets)
        assert got == one.draft_batch(ids, budgets), f"seed {seed}, step {step}"
        compared += len(ids)
        for rid in list(live):
            tokens = seq(0, 6)
            for idx in (one, many):
                idx.extend(rid, tokens)
            if rng.random() < 0.05:
                for idx in (one, many):
                    idx.remove_request(rid)
                del live[rid]
        if scorer == "anchors":
            a, b = one.learnt_counts(), many.learnt_counts()
            assert all(np.array_equal(a[k], b[k]) for k in a), f"seed {seed}, step {step}"
    assert one.check_integrity() is None and many.check_integrity() is None
    return compared


@pytest.mark.parametrize("scorer", ["anchors", "counts"])
@pytest.mark.parametrize("seed", range(4))
def test_threads_draft_as_one_thread(scorer, seed):
    assert random_workload(seed, scorer) > 100


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), threads=st.integers(2, 6), scorer=st.sampled_from(["anchors", "counts"]))
def test_threads_draft_as_one_thread_hypothesis(seed, threads, scorer):
    random_workload(seed, scorer, threads)


def test_timed_drafts_cap_the_threads():
    """``draft_batch_timed(threads=t)`` (the bench's switch) drafts as ``draft_batch`` on any number of threads."""
    idx = make("anchors", 3, SOURCES, 1, 32)
    idx.set_history("p", [np.arange(50, dtype=np.int32) % 7], [WEIGHT_ONE])
    ids = [f"r{i}" for i in range(20)]
    for i, rid in enumerate(ids):
        idx.start(rid, "p", [i % 7])
    drafts = [idx._impl.draft_batch_timed(ids, [8] * len(ids), threads=t) for t in (0, 1, 2, 3, 9)]
    assert all(d[0] == drafts[0][0] and len(d[1]) == len(ids) for d in drafts)
    with pytest.raises(ValueError, match="threads=-1"):
        idx._impl.draft_batch_timed(ids, [8] * len(ids), threads=-1)


def test_threaded_drafts_under_concurrent_calls():
    """Python threads draft batches (each spread over the pool, or alone while the pool is busy), extend and end
    requests at once: no deadlock, no lost draft, consistent structures."""
    idx = make("anchors", 4, ("history", "running", "self"), 1, 16)
    base = np.random.default_rng(2).integers(0, 12, size=400)
    idx.set_history("p", [base.astype(np.int32)], [WEIGHT_ONE])

    def worker(w: int) -> None:
        for i in range(20):
            ids = [f"w{w}-{i}-{k}" for k in range(8)]
            for rid in ids:
                idx.start(rid, "p", [3, 9])
            for pos in range(0, 40, 4):
                drafts = idx.draft_batch(ids, [8] * len(ids))
                assert len(drafts) == len(ids) and all(len(d[0]) <= 8 for d in drafts)
                for rid in ids:
                    idx.extend(rid, base[(w + i + pos) % 300 :][:4].tolist())
            for rid in ids:
                idx.remove_request(rid)

    run_threads(worker, 3)
    assert idx.check_integrity() is None


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_config_rejects_bad_thread_counts(bad):
    with pytest.raises(ValueError, match="draft_threads"):
        DrafterConfig(draft_threads=bad)
    with pytest.raises(ValueError, match="draft_threads"):
        NativeAnchorIndex(min_match=1, max_match=8, prompt_tail=1, sources=("history",), draft_threads=bad)


@pytest.mark.parametrize("scorer", ["anchors", "counts"])
def test_facade_passes_the_threads_to_the_native_backend(scorer):
    d = HistoSpecDrafter(DrafterConfig(scorer=scorer, backend="native", draft_threads=3))
    assert d._index.draft_threads() == 3
    d.add("p", 0, [[5, 6, 7, 8]], prompt_tokens=[1, 2])
    d.start("r", "p", [1, 2])
    assert d.draft("r", 4).token_ids[:1] == [5]
    ref = HistoSpecDrafter(DrafterConfig(scorer=scorer, backend="python", draft_threads=3))  # one thread there
    ref.add("p", 0, [[5, 6, 7, 8]], prompt_tokens=[1, 2])
    ref.start("r", "p", [1, 2])
    assert ref.draft("r", 4) == d.draft("r", 4)


def test_bench_index_reports_step_times_per_thread_setting(capsys):
    """``histospec bench index --draft-threads N``: step wall times on one thread and on N; the decode (hence tau)
    is that of one thread."""
    import json

    from sglang_histospec import cli

    argv = ["bench", "index", "--prompts", "6", "--responses", "2", "--length", "96", "--steps", "6", "--json"]
    results = []
    for threads in ("1", "3"):
        assert cli.main([*argv, "--reference-prompts", "0", "--draft-threads", threads]) == 0
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    one, three = results
    assert (one["threads"], three["threads"]) == (1, 3)
    for r in results:
        assert r["step_ms_1thread"] > 0 and r["step_ms_threads"] > 0 and r["draft_us_p99_threads"] > 0
    assert one["tau"] == three["tau"] and one["request_steps"] == three["request_steps"]
    with pytest.raises(SystemExit, match="--draft-threads=0"):
        cli.main([*argv, "--draft-threads", "0"])
