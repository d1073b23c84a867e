"""Differential tests: the native index (C++) against the pure-Python reference, op sequence by op sequence.

Random histories over small vocabularies (so that matches and branching happen) and random request operations;
both backends must return identical drafts (token ids, parents, probabilities, match length, source), and the
native structures must pass ``check_integrity()`` after every mutation. A quick subset runs in the default suite;
``-m slow`` runs more than 100,000 operations.
"""

from __future__ import annotations

import json
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting import _native
from sglang_histospec.drafting.drafter import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.native import NativeIndex
from sglang_histospec.drafting.reference import WEIGHT_ONE, ReferenceIndex
from sglang_histospec.drafting.types import COUNTS_SOURCES

VOCAB = 4
PROMPTS = ("p0", "p1", "p2")
REQS = ("r0", "r1", "r2", "r3")

tokens = st.lists(st.integers(0, VOCAB - 1), max_size=8)
sequence = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16)
weight = st.sampled_from([1, 3, WEIGHT_ONE, 2 * WEIGHT_ONE, 3 * WEIGHT_ONE])
backend_kwargs = st.fixed_dictionaries(
    {
        "min_match": st.integers(1, 3),
        "max_match": st.sampled_from([3, 4, 8, 32]),
        "tree": st.booleans(),
        "min_prob": st.sampled_from([0.01, 0.1, 0.25, 0.5, 1.0]),
        "use_frequency": st.booleans(),
        "sources": st.lists(st.sampled_from(COUNTS_SOURCES), min_size=1, max_size=4, unique=True).map(tuple),
    }
)
backend_op = st.one_of(
    st.tuples(st.just("history"), st.sampled_from(PROMPTS), st.lists(st.tuples(sequence, weight), max_size=4)),
    st.tuples(st.just("sibling"), st.sampled_from(PROMPTS), sequence),
    st.tuples(st.just("clear_siblings")),
    st.tuples(st.just("add_global"), st.integers(0, 3), st.lists(sequence, min_size=1, max_size=3)),
    st.tuples(st.just("remove_global"), st.integers(0, 3)),
    st.tuples(st.just("start"), st.sampled_from(REQS), st.sampled_from((*PROMPTS, None)), tokens),
    st.tuples(st.just("extend"), st.sampled_from(REQS), tokens),
    st.tuples(st.just("remove"), st.sampled_from(REQS)),
    st.tuples(
        st.just("draft"), st.lists(st.tuples(st.sampled_from(REQS), st.integers(0, 12)), min_size=1, max_size=4)
    ),
)


def _arrays(seqs) -> list[np.ndarray]:
    return [np.asarray(s, dtype=np.int32) for s in seqs]


def apply_backend_op(op, ref: ReferenceIndex, nat: NativeIndex) -> int:
    """Apply one operation to both backends; compare drafts. Returns the number of drafts compared."""
    kind = op[0]
    if kind == "history":
        seqs, weights = _arrays(s for s, _ in op[2]), [w for _, w in op[2]]
        ref.set_history(op[1], seqs, weights)
        nat.set_history(op[1], seqs, weights)
    elif kind == "sibling":
        ref.add_sibling(op[1], _arrays([op[2]])[0], WEIGHT_ONE)
        nat.add_sibling(op[1], _arrays([op[2]])[0], WEIGHT_ONE)
    elif kind == "clear_siblings":
        ref.clear_siblings()
        nat.clear_siblings()
    elif kind == "add_global":
        for idx in (ref, nat):
            idx.remove_global(op[1])
            idx.add_global(op[1], _arrays(op[2]), [WEIGHT_ONE] * len(op[2]))
    elif kind == "remove_global":
        ref.remove_global(op[1])
        nat.remove_global(op[1])
    elif kind == "start":
        ref.start(op[1], op[2], op[3])
        nat.start(op[1], op[2], op[3])
    elif kind == "extend" and ref.has_request(op[1]):
        ref.extend(op[1], op[2])
        nat.extend(op[1], op[2])
    elif kind == "remove":
        ref.remove_request(op[1])
        nat.remove_request(op[1])
    elif kind == "draft":
        pairs = [(r, b) for r, b in op[1] if ref.has_request(r)]
        if not pairs:
            return 0
        ids, budgets = [r for r, _ in pairs], [b for _, b in pairs]
        expected, got = ref.draft_batch(ids, budgets), nat.draft_batch(ids, budgets)
        for rid, b, e, g in zip(ids, budgets, expected, got):
            assert tuple(g) == tuple(e), f"request {rid}, budget {b}"
        return len(pairs)
    assert ref.has_request("r0") == nat.has_request("r0")
    return 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs=backend_kwargs, ops=st.lists(backend_op, max_size=40))
def test_backends_draft_identically(kwargs, ops):
    ref, nat = ReferenceIndex(**kwargs), NativeIndex(**kwargs)
    for op in ops:
        apply_backend_op(op, ref, nat)
        assert nat.check_integrity() is None


def random_backend_run(seed: int, num_ops: int) -> tuple[int, int]:
    """A seeded random op sequence (larger vocabularies and contexts than the hypothesis strategy)."""
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 8, 50])
    kwargs = {
        "min_match": rng.choice([1, 1, 2, 3]),
        "max_match": rng.choice([2, 4, 8, 32]),
        "tree": rng.random() < 0.7,
        "min_prob": rng.choice([0.01, 0.05, 0.1, 0.3]),
        "use_frequency": rng.random() < 0.7,
        "sources": tuple(s for s in COUNTS_SOURCES if rng.random() < 0.6) or ("history",),
    }
    ref, nat = ReferenceIndex(**kwargs), NativeIndex(**kwargs)

    def seq(lo=1, hi=40):
        return [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]

    drafts = 0
    for _ in range(num_ops):
        r = rng.random()
        if r < 0.08:
            op = ("history", rng.choice(PROMPTS), [(seq(), rng.choice([1, WEIGHT_ONE, 3])) for _ in range(4)])
        elif r < 0.12:
            op = ("sibling", rng.choice(PROMPTS), seq())
        elif r < 0.13:
            op = ("clear_siblings",)
        elif r < 0.17:
            op = ("add_global", rng.randrange(5), [seq() for _ in range(rng.randint(1, 3))])
        elif r < 0.18:
            op = ("remove_global", rng.randrange(5))
        elif r < 0.26:
            op = ("start", rng.choice(REQS), rng.choice((*PROMPTS, None)), seq(0, 12))
        elif r < 0.29:
            op = ("remove", rng.choice(REQS))
        elif r < 0.65:
            op = ("extend", rng.choice(REQS), seq(0, 5))
        else:
            op = ("draft", [(rng.choice(REQS), rng.choice([0, 1, 2, 4, 8, 16, 32])) for _ in range(3)])
        drafts += apply_backend_op(op, ref, nat)
        if op[0] != "draft" or rng.random() < 0.1:
            assert nat.check_integrity() is None
    return num_ops, drafts


@pytest.mark.parametrize("seed", range(6))
def test_backends_seeded_quick(seed):
    ops, drafts = random_backend_run(seed, 300)
    assert drafts > 50


@pytest.mark.parametrize("use_frequency", [True, False])
def test_many_siblings_merge_into_parts(use_frequency):
    """Siblings are kept as a binary counter of index parts; drafts aggregate over all of them exactly."""
    kwargs = dict(
        min_match=1, max_match=6, tree=True, min_prob=0.05, use_frequency=use_frequency, sources=COUNTS_SOURCES
    )
    ref, nat = ReferenceIndex(**kwargs), NativeIndex(**kwargs)
    rng = random.Random(7)
    base = [rng.randrange(6) for _ in range(30)]
    for r in range(4):
        for idx in (ref, nat):
            idx.start(f"r{r}", "p", base[:3])
    for k in range(13):
        sib = [t if rng.random() < 0.8 else rng.randrange(6) for t in base]
        for idx in (ref, nat):
            idx.add_sibling("p", np.asarray(sib, dtype=np.int32), WEIGHT_ONE * (1 + k % 2))
        assert nat.check_integrity() is None
        for r in range(4):
            ids = [f"r{r}"]
            assert nat.draft_batch(ids, [8]) == ref.draft_batch(ids, [8])
            step = base[3 + k + r : 5 + k + r]
            ref.extend(ids[0], step)
            nat.extend(ids[0], step)
    assert any(toks for toks, *_ in nat.draft_batch([f"r{r}" for r in range(4)], [8] * 4))


@pytest.mark.slow
def test_backends_seeded_100k_operations():
    total = drafts = 0
    seed = 1000
    while total < 100_000:
        ops, d = random_backend_run(seed, 500)
        total, drafts, seed = total + ops, drafts + d, seed + 1
    assert drafts > 20_000


# ---- the facade with both backends: steps, siblings, pushes, windows, LRU eviction -----------------------------

facade_op = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from(PROMPTS),
        st.integers(0, 4),
        st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=14), min_size=1, max_size=4),
        st.one_of(st.none(), st.just("rewards")),
    ),
    st.tuples(st.just("start"), st.sampled_from(REQS), st.sampled_from((*PROMPTS, None)), tokens),
    st.tuples(st.just("extend"), st.sampled_from(REQS), tokens),
    st.tuples(st.just("draft"), st.sampled_from(REQS), st.integers(0, 10)),
    st.tuples(st.just("draft_batch"), st.lists(st.tuples(st.sampled_from(REQS), st.integers(0, 10)), max_size=4)),
    st.tuples(st.just("finish"), st.sampled_from(REQS), st.lists(st.integers(0, VOCAB - 1), max_size=14)),
    st.tuples(st.just("abort"), st.sampled_from(REQS)),
    st.tuples(st.just("end_step"), st.one_of(st.none(), st.integers(0, 5))),
)
facade_config = st.fixed_dictionaries(
    {
        "window": st.integers(1, 3),
        "min_match": st.integers(1, 2),
        "max_match": st.sampled_from([3, 6, 32]),
        "prompt_tail": st.integers(0, 3),
        "tree": st.booleans(),
        "min_prob": st.sampled_from([0.05, 0.1, 0.3]),
        "recency_decay": st.sampled_from([1.0, 0.5, 0.3]),
        "reward_weight": st.sampled_from([0.0, 1.0, 2.5]),
        "use_frequency": st.booleans(),
        "sources": st.lists(st.sampled_from(COUNTS_SOURCES), min_size=1, max_size=4, unique=True).map(tuple),
        "capacity_tokens": st.sampled_from([30, 80, 10_000]),
        "global_capacity_tokens": st.sampled_from([20, 1000]),
    }
)


def apply_facade_op(op, drafters: list[HistoSpecDrafter], rng: random.Random) -> None:
    kind = op[0]
    live = drafters[0]._requests  # both facades track the same request ids
    if kind == "add":
        rewards = [rng.choice([0.0, 0.5, 1.0]) for _ in op[3]] if op[4] else None
        stored = {d.add(op[1], op[2], op[3], rewards=rewards) for d in drafters}
        assert len(stored) == 1
    elif kind == "start" and op[1] not in live:
        for d in drafters:
            d.start(op[1], op[2], op[3])
    elif kind == "extend" and op[1] in live:
        for d in drafters:
            d.extend(op[1], op[2])
    elif kind == "draft" and op[1] in live:
        got = [d.draft(op[1], op[2]) for d in drafters]
        assert got[0] == got[1], f"draft of {op[1]} at budget {op[2]}"
    elif kind == "draft_batch":
        pairs = [(r, b) for r, b in op[1] if r in live]
        got = [d.draft_batch([r for r, _ in pairs], [b for _, b in pairs]) for d in drafters]
        assert got[0] == got[1]
    elif kind == "finish" and op[1] in live:
        for d in drafters:
            d.finish(op[1], op[2])
    elif kind == "abort" and op[1] in live:
        for d in drafters:
            d.abort(op[1])
    elif kind == "end_step":
        for d in drafters:
            d.end_step(op[1])


def _comparable_stats(d: HistoSpecDrafter) -> dict:
    return {k: v for k, v in d.stats().items() if k not in ("backend", "memory_bytes")}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=facade_config, ops=st.lists(facade_op, max_size=40), seed=st.integers(0, 2**16))
def test_facade_backends_agree(config, ops, seed):
    python = HistoSpecDrafter(DrafterConfig(backend="python", scorer="counts", **config))
    native = HistoSpecDrafter(DrafterConfig(backend="native", scorer="counts", **config))
    assert (python.backend, native.backend) == ("python", "native")
    rng = random.Random(seed)
    for op in ops:
        apply_facade_op(op, [python, native], rng)
        assert native.check_integrity() is None
        assert python.prompt_sizes() == native.prompt_sizes()
        assert _comparable_stats(python) == _comparable_stats(native)


# ---- unit tests of the native pieces ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(s=st.lists(st.integers(0, 3), max_size=60), extra=st.integers(0, 2))
def test_suffix_array_matches_sorting(s, extra):
    alphabet = 4 + extra
    got = _native.suffix_array(np.asarray(s, dtype=np.int32), alphabet)
    assert got == sorted(range(len(s)), key=lambda i: s[i:])


def test_worked_example_and_sources():
    idx = NativeIndex(min_match=1, max_match=8, tree=True, min_prob=0.1, use_frequency=True, sources=("history",))
    idx.set_history("p", [np.array([7, 1, 2, 3], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [5, 7])
    assert idx.draft_batch(["r"], [2]) == [([1, 2], [-1, 0], [1.0, 1.0], 1, "history")]
    # two responses branch after [7, 1]: the more frequent child first, probabilities from the weights
    idx.set_history("p", _arrays([[7, 1, 2], [7, 1, 2], [7, 1, 9]]), [WEIGHT_ONE] * 3)
    idx.extend("r", [1])
    toks, parents, probs, match_len, source = idx.draft_batch(["r"], [4])[0]
    assert (toks, parents, match_len, source) == ([2, 9], [-1, -1], 2, "history")
    assert probs == [2 / 3, 1 / 3]
    assert idx.check_integrity() is None
    # the numpy input path gives the same drafts as the list path
    idx.start("r2", "p", np.array([5, 7, 1], dtype=np.int32))
    assert idx.draft_batch(["r2"], [4]) == idx.draft_batch(["r"], [4])


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="source .nope.: the counts scorer drafts from a subset"):
        NativeIndex(min_match=1, max_match=4, tree=True, min_prob=0.1, use_frequency=True, sources=("nope",))
    idx = NativeIndex(min_match=1, max_match=4, tree=True, min_prob=0.1, use_frequency=True, sources=COUNTS_SOURCES)
    with pytest.raises(ValueError, match="one weight per sequence"):
        idx.set_history("p", _arrays([[1, 2]]), [])
    with pytest.raises(ValueError, match="weight 0 < 1"):
        idx.set_history("p", _arrays([[1, 2]]), [0])
    with pytest.raises(ValueError, match="negative"):
        idx.add_sibling("p", np.array([1, -3], dtype=np.int32), 1)
    with pytest.raises(ValueError, match="1-D"):
        idx.set_history("p", [np.zeros((2, 2), dtype=np.int32)], [1])
    with pytest.raises(ValueError, match="one budget per request"):
        idx.draft_batch(["r"], [])
    with pytest.raises(IndexError):
        idx.draft_batch(["unknown"], [4])
    # the facade turns the same mistakes into ValueErrors naming the value
    d = HistoSpecDrafter(DrafterConfig(backend="native", scorer="counts"))
    with pytest.raises(ValueError, match="unknown req_id"):
        d.draft("nope", 4)


def test_readers_survive_concurrent_history_replacement():
    """Drafting threads keep working while another thread replaces the prompt's history over and over."""
    idx = NativeIndex(min_match=1, max_match=16, tree=True, min_prob=0.05, use_frequency=True, sources=("history",))
    rng = np.random.default_rng(0)
    base = rng.integers(0, 50, size=2000, dtype=np.int32)
    histories = [[np.where(rng.random(2000) < 0.1, 7, base).astype(np.int32) for _ in range(8)] for _ in range(4)]
    idx.set_history("p", histories[0], [WEIGHT_ONE] * 8)
    for r in range(4):
        idx.start(f"r{r}", "p", base[:5].tolist())
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader(r: int) -> None:
        try:
            pos = 5
            while not stop.is_set():
                for toks, parents, probs, _, _ in idx.draft_batch([f"r{r}"], [16]):
                    assert all(p == -1 or p < i for i, p in enumerate(parents)) and len(toks) == len(probs)
                idx.extend(f"r{r}", base[pos : pos + 3].tolist())
                pos = 5 + (pos + 3) % 1900
        except BaseException as exc:  # noqa: BLE001 - surfaced to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for i in range(40):
        idx.set_history("p", histories[i % 4], [WEIGHT_ONE] * 8)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert idx.check_integrity() is None


def test_memory_per_history_token():
    idx = NativeIndex(min_match=1, max_match=32, tree=True, min_prob=0.1, use_frequency=True, sources=("history",))
    empty = idx.memory_bytes()
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 1000, size=4096, dtype=np.int32) for _ in range(16)]
    idx.set_history("p", seqs, [WEIGHT_ONE] * 16)
    assert idx.history_tokens() == 16 * 4096
    per_token = (idx.memory_bytes() - empty) / (16 * 4096)
    assert 20 <= per_token <= 24  # text, suffix array, its inverse, int64 weight sums, first-token table


def test_bench_index_command_prints_json(capsys):
    from sglang_histospec import cli

    argv = ["bench", "index", "--prompts", "3", "--responses", "4", "--length", "128", "--steps", "6"]
    assert cli.main([*argv, "--reference-prompts", "2", "--reference-length", "64", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ingest_tokens_per_s", "draft_us_p50", "draft_us_p99", "bytes_per_token", "batch"):
        assert result[key] > 0, key
    assert result["history_tokens_per_prompt"] == 4 * (128 + 4)  # responses x (prompt tail + length)
    assert result["batch"] == 3 and result["tau"] >= 1.0
    # the side-by-side run drafts the same workload with both backends: identical acceptance
    assert result["reference_python_tau"] == result["reference_native_tau"]


def test_auto_backend_picks_the_native_index():
    """CI builds the extension from source, so the facade's default backend is the native one."""
    assert HistoSpecDrafter(DrafterConfig()).backend == "native"
    assert HistoSpecDrafter(DrafterConfig(backend="python")).backend == "python"
