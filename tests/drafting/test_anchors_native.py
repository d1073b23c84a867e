"""Differential tests of the anchor scorer: ``NativeAnchorIndex`` (C++) against ``AnchorIndex`` (the Python
specification), call sequence by call sequence.

Small vocabularies (so that exact and substituted matches happen), several interleaved requests, contexts that
grow past DEPTH_MAX tokens after their drafts (so that the learnt rates and the re-ranker move): both
backends must return identical drafts (floats compared with ==) and hold identical learnt counts, and both must
pass ``check_integrity()`` after every call. ``-m slow`` runs a larger seeded sweep.
"""

from __future__ import annotations

import json
import random
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.anchors import DEPTH_MAX, SCAN, AnchorIndex
from sglang_histospec.drafting.native_anchors import NativeAnchorIndex  # CI builds the extension from source
from sglang_histospec.drafting.types import SOURCES, WEIGHT_ONE, accepted_length
from tests.helpers.threads import run_threads

VOCAB = 4
PROMPTS = ("p0", "p1", "p2")
REQS = ("r0", "r1", "r2", "r3")

tokens = st.lists(st.integers(0, VOCAB - 1), max_size=12)
sequence = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)
weight = st.sampled_from([1, 3, WEIGHT_ONE // 4, WEIGHT_ONE // 2, WEIGHT_ONE, 3 * WEIGHT_ONE])
index_kwargs = st.fixed_dictionaries(
    {
        "min_match": st.integers(1, 3),
        "max_match": st.sampled_from([3, 4, 8, 32]),
        "prompt_tail": st.integers(0, 3),
        "sources": st.lists(st.sampled_from(SOURCES), min_size=1, max_size=len(SOURCES), unique=True).map(tuple),
    }
)
index_op = st.one_of(
    st.tuples(st.just("history"), st.sampled_from(PROMPTS), st.lists(st.tuples(sequence, weight), max_size=4)),
    st.tuples(st.just("sibling"), st.sampled_from(PROMPTS), sequence),
    st.tuples(st.just("clear_siblings")),
    st.tuples(st.just("add_global"), st.integers(0, 3), st.lists(sequence, min_size=1, max_size=3)),
    st.tuples(st.just("remove_global"), st.integers(0, 3)),
    st.tuples(st.just("start"), st.sampled_from(REQS), st.sampled_from((*PROMPTS, None)), tokens),
    st.tuples(st.just("extend"), st.sampled_from(REQS), tokens),
    st.tuples(st.just("remove"), st.sampled_from(REQS)),
    st.tuples(
        st.just("draft"), st.lists(st.tuples(st.sampled_from(REQS), st.integers(0, 40)), min_size=1, max_size=4)
    ),
)


def _arrays(seqs) -> list[np.ndarray]:
    return [np.asarray(s, dtype=np.int32) for s in seqs]


def assert_same_learning(ref: AnchorIndex, nat: NativeAnchorIndex) -> None:
    got = nat.learnt_counts()
    for name in ("tries", "hits", "weights"):
        expected = np.asarray(getattr(ref, f"_{name}"))
        assert got[name].shape == expected.shape and np.array_equal(got[name], expected), name


def apply_op(op, ref: AnchorIndex, nat: NativeAnchorIndex) -> int:
    """Apply one call to both backends and compare what it returns; the number of drafts compared."""
    kind = op[0]
    both = (ref, nat)
    if kind == "history":
        seqs, weights = _arrays(s for s, _ in op[2]), [w for _, w in op[2]]
        for idx in both:
            idx.set_history(op[1], seqs, weights)
    elif kind == "sibling":
        for idx in both:
            idx.add_sibling(op[1], _arrays([op[2]])[0], WEIGHT_ONE)
    elif kind == "clear_siblings":
        for idx in both:
            idx.clear_siblings()
    elif kind == "add_global":  # an existing key keeps its place (a dict), as the reference's
        for idx in both:
            idx.add_global(op[1], _arrays(op[2]), [WEIGHT_ONE] * len(op[2]))
    elif kind == "remove_global":
        for idx in both:
            idx.remove_global(op[1])
    elif kind == "start":  # restarting a live id drops its pending drafts unlearnt, in both
        for idx in both:
            idx.start(op[1], op[2], op[3])
    elif kind == "extend" and ref.has_request(op[1]):
        for idx in both:
            idx.extend(op[1], op[2])
    elif kind == "remove":
        for idx in both:
            idx.remove_request(op[1])
    elif kind == "draft":
        pairs = [(r, b) for r, b in op[1] if ref.has_request(r)]
        ids, budgets = [r for r, _ in pairs], [b for _, b in pairs]
        expected, got = ref.draft_batch(ids, budgets), nat.draft_batch(ids, budgets)
        for rid, b, e, g in zip(ids, budgets, expected, got, strict=True):
            assert tuple(g) == tuple(e), f"request {rid}, budget {b}"
        return len(pairs)
    assert [ref.has_request(r) for r in REQS] == [nat.has_request(r) for r in REQS]
    return 0


def check_both(ref: AnchorIndex, nat: NativeAnchorIndex) -> None:
    assert ref.check_integrity() is None
    assert nat.check_integrity() is None
    assert_same_learning(ref, nat)


def run_both(kwargs: dict, ops) -> None:
    """Apply ``ops`` to both backends, checking them after every call, then end every request."""
    ref, nat = AnchorIndex(**kwargs), NativeAnchorIndex(**kwargs)
    for op in ops:
        apply_op(op, ref, nat)
        check_both(ref, nat)
    for r in REQS:  # the end of every request resolves its pending drafts with whatever is known
        apply_op(("remove", r), ref, nat)
    check_both(ref, nat)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs=index_kwargs, ops=st.lists(index_op, max_size=60))
def test_backends_draft_and_learn_identically(kwargs, ops):
    run_both(kwargs, ops)


# Concurrent siblings: every request of one prompt (or none), the running source always on, many extends.
running_kwargs = index_kwargs.map(lambda kw: {**kw, "sources": tuple({*kw["sources"], "running"})})
running_op = st.one_of(
    st.tuples(st.just("start"), st.sampled_from(REQS), st.sampled_from(("p0", "p0", None)), tokens),
    st.tuples(st.just("extend"), st.sampled_from(REQS), tokens),
    st.tuples(st.just("extend"), st.sampled_from(REQS), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3)),
    st.tuples(st.just("remove"), st.sampled_from(REQS)),
    st.tuples(st.just("sibling"), st.just("p0"), sequence),
    st.tuples(
        st.just("draft"), st.lists(st.tuples(st.sampled_from(REQS), st.integers(0, 40)), min_size=1, max_size=4)
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs=running_kwargs, ops=st.lists(running_op, max_size=80))
def test_running_siblings_draft_and_learn_identically(kwargs, ops):
    run_both(kwargs, ops)


def random_run(seed: int, num_ops: int) -> tuple[int, int]:
    """A seeded random call sequence with longer sequences and contexts than the hypothesis strategy: many drafts
    resolve (DEPTH_MAX tokens after them become known), so later drafts read learnt rates and weights."""
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 8, 50])
    min_match = rng.choice([1, 1, 2, 3])
    kwargs = {
        "min_match": min_match,
        "max_match": max(min_match, rng.choice([2, 4, 8, 32])),
        "prompt_tail": rng.choice([0, 1, 4]),
        "sources": tuple(s for s in SOURCES if rng.random() < 0.6) or ("history",),
    }
    ref, nat = AnchorIndex(**kwargs), NativeAnchorIndex(**kwargs)

    def seq(lo=1, hi=60):
        return [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]

    drafts = 0
    for _ in range(num_ops):
        r = rng.random()
        if r < 0.06:
            op = ("history", rng.choice(PROMPTS), [(seq(), rng.choice([1, WEIGHT_ONE, 3])) for _ in range(4)])
        elif r < 0.10:
            op = ("sibling", rng.choice(PROMPTS), seq())
        elif r < 0.11:
            op = ("clear_siblings",)
        elif r < 0.14:
            op = ("add_global", rng.randrange(5), [seq() for _ in range(rng.randint(1, 3))])
        elif r < 0.15:
            op = ("remove_global", rng.randrange(5))
        elif r < 0.20:
            op = ("start", rng.choice(REQS), rng.choice((*PROMPTS, None)), seq(0, 12))
        elif r < 0.22:
            op = ("remove", rng.choice(REQS))
        elif r < 0.60:
            op = ("extend", rng.choice(REQS), seq(0, 6))
        else:
            op = ("draft", [(rng.choice(REQS), rng.choice([0, 1, 2, 4, 8, 16, 32, 40])) for _ in range(3)])
        drafts += apply_op(op, ref, nat)
        if op[0] in ("extend", "remove") or rng.random() < 0.1:
            check_both(ref, nat)
    for r in REQS:
        apply_op(("remove", r), ref, nat)
    check_both(ref, nat)
    return drafts, int(ref._tries.sum())


@pytest.mark.parametrize("seed", range(6))
def test_backends_seeded_quick(seed):
    drafts, tries = random_run(seed, 300)
    assert drafts > 50 and tries > 0


@pytest.mark.slow
def test_backends_seeded_sweep():
    for seed in range(1000, 1040):
        random_run(seed, 600)


def test_scan_cap_and_long_learning():
    """More than SCAN candidate positions per source and kind, and hundreds of resolved drafts at two budgets."""
    rng = random.Random(3)
    kwargs = dict(min_match=1, max_match=32, prompt_tail=2, sources=SOURCES)
    ref, nat = AnchorIndex(**kwargs), NativeAnchorIndex(**kwargs)
    history = [[rng.randrange(2) for _ in range(200)] for _ in range(3)]
    assert sum(h.count(0) for h in history) > SCAN
    for idx in (ref, nat):
        idx.set_history("p", _arrays(history), [WEIGHT_ONE, WEIGHT_ONE // 2, WEIGHT_ONE // 8])
        idx.add_sibling("p", _arrays([history[0][:150]])[0], WEIGHT_ONE)
        idx.add_global(0, _arrays(history[1:]), [WEIGHT_ONE] * 2)
        idx.start("r", "p", [1, 0, 1])
    truth = [t if rng.random() < 0.8 else 1 - t for t in history[0]] * 2
    pos, step = 0, 0
    while pos < len(truth):
        budget = (24, DEPTH_MAX + 8)[step % 2]  # the budget-24 drafts learn nothing at depths 24+
        step += 1
        expected = ref.draft_batch(["r"], [budget])
        assert nat.draft_batch(["r"], [budget]) == expected
        toks, parents = expected[0][:2]
        k = min(accepted_length(toks, parents, truth, pos) + 1, len(truth) - pos)  # accepted tokens + the bonus
        for idx in (ref, nat):
            idx.extend("r", truth[pos : pos + k])
        pos += k
    assert ref._tries[:, DEPTH_MAX - 1].sum() > 100
    assert ref._tries[:, 23].sum() > ref._tries[:, 24].sum()
    check_both(ref, nat)


@pytest.mark.parametrize("min_match", [1, 2, 3])
@pytest.mark.parametrize("lengths", [(40, 80), (110, 160)])  # a sibling's token: walked (<= 32 postings) or paired
def test_scan_cap_over_many_corpora(min_match, lengths):
    """SCAN positions of a key spread over many sibling and global corpora: the scans that need two matched tokens
    (substitutions, global, min_match >= 2) read the pair postings of a token with more than 32 postings in its
    corpus (and walk the others), under a cap that counts the newer corpora's positions."""
    rng = random.Random(11 + min_match)
    kwargs = dict(min_match=min_match, max_match=32, prompt_tail=2, sources=("history", "siblings", "global"))
    ref, nat = AnchorIndex(**kwargs), NativeAnchorIndex(**kwargs)
    seqs = [[rng.randrange(3) for _ in range(rng.randrange(*lengths))] for _ in range(40)]
    assert sum(s.count(0) for s in seqs[:20]) > SCAN and sum(s.count(0) for s in seqs[20:]) > SCAN
    for idx in (ref, nat):
        idx.set_history("p", _arrays(seqs[:3]), [WEIGHT_ONE] * 3)
        for s in seqs[:20]:
            idx.add_sibling("p", _arrays([s])[0], WEIGHT_ONE)
        for key in range(20):
            idx.add_global(key, _arrays(seqs[20 + key : 21 + key]), [WEIGHT_ONE])
        idx.start("r", "p", [1, 0, 2])
    truth = [rng.randrange(3) for _ in range(300)]
    for pos in range(0, len(truth), 3):
        expected = ref.draft_batch(["r"], [8])
        assert nat.draft_batch(["r"], [8]) == expected
        for idx in (ref, nat):
            idx.extend("r", truth[pos : pos + 3])
    check_both(ref, nat)


def test_running_scan_cap_and_lockstep_learning():
    """Three running siblings in lockstep, each past SCAN positions of a key token: the cap counts positions over
    all of them, newest started first, and both backends learn the running classes identically."""
    rng = random.Random(5)
    kwargs = dict(min_match=1, max_match=32, prompt_tail=2, sources=("running", "self"))
    ref, nat = AnchorIndex(**kwargs), NativeAnchorIndex(**kwargs)
    truths = [[rng.randrange(2) for _ in range(400)] for _ in range(3)]
    pos = [0, 0, 0]
    for idx in (ref, nat):
        for i in range(3):
            idx.start(f"r{i}", "p", [1, 0, 1])
    while min(pos) < 400:
        for i, truth in enumerate(truths):
            if pos[i] >= len(truth):
                continue
            expected = ref.draft_batch([f"r{i}"], [16])
            assert nat.draft_batch([f"r{i}"], [16]) == expected
            toks, parents = expected[0][:2]
            k = min(accepted_length(toks, parents, truth, pos[i]) + 1, len(truth) - pos[i])
            for idx in (ref, nat):
                idx.extend(f"r{i}", truth[pos[i] : pos[i] + k])
            pos[i] += k
    assert sum(t.count(0) for t in truths) > 2 * SCAN
    running = SOURCES.index("running") * (len(ref._tries) // len(SOURCES))
    assert ref._tries[running:, 0].sum() > 0  # the running classes learnt
    check_both(ref, nat)


# ---- the facade: HistoSpecDrafter(scorer="anchors") on both backends ----------------------------------------


def test_facade_backends_agree():
    cfgs = [
        DrafterConfig(scorer="anchors", backend=b, window=2, prompt_tail=2, max_match=8) for b in ("python", "native")
    ]
    python, native = (HistoSpecDrafter(c) for c in cfgs)
    assert (python.backend, native.backend) == ("python", "native")
    rng = random.Random(11)
    base = [rng.randrange(6) for _ in range(80)]
    for step in range(3):
        responses = [[t if rng.random() < 0.9 else 5 for t in base] for _ in range(3)]
        for d in (python, native):
            d.add("p", step, responses, prompt_tokens=[1, 2])
        for i in range(2):
            for d in (python, native):
                d.start(f"r{step}{i}", "p" if i else None, [1, 2])
            for pos in range(0, 70, 3):
                got = [d.draft(f"r{step}{i}", 12) for d in (python, native)]
                assert got[0] == got[1]
                for d in (python, native):
                    d.extend(f"r{step}{i}", base[pos : pos + 3])
            for d in (python, native):
                d.finish(f"r{step}{i}", base[:70])
        for d in (python, native):
            d.end_step()
        assert_same_learning(python._index, native._index)
        assert native.check_integrity() is None


def test_backend_python_forces_the_reference():
    assert isinstance(HistoSpecDrafter(DrafterConfig(scorer="anchors", backend="python"))._index, AnchorIndex)
    assert isinstance(HistoSpecDrafter(DrafterConfig(scorer="anchors"))._index, NativeAnchorIndex)


def test_without_the_extension_auto_falls_back(monkeypatch):
    """A build without AnchorDrafter (ImportError): "auto" drafts with the reference, "native" names the fix."""
    monkeypatch.setitem(sys.modules, "sglang_histospec.drafting.native_anchors", None)
    d = HistoSpecDrafter(DrafterConfig(scorer="anchors"))
    assert d.backend == "python" and isinstance(d._index, AnchorIndex)
    with pytest.raises(ValueError, match="backend='native'.*scorer='anchors'.*make install"):
        HistoSpecDrafter(DrafterConfig(scorer="anchors", backend="native"))


def test_bench_index_scorer_anchors(capsys):
    """``histospec bench index --scorer anchors`` drafts the same workload with both backends: identical tau."""
    from sglang_histospec import cli

    argv = ["bench", "index", "--scorer", "anchors", "--prompts", "3", "--responses", "2", "--length", "96"]
    assert cli.main([*argv, "--steps", "6", "--reference-prompts", "2", "--reference-length", "64", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["scorer"] == "anchors" and result["draft_us_p50"] > 0 and result["tau"] >= 1.0
    assert result["reference_python_tau"] == result["reference_native_tau"]


# ---- the native wrapper's own checks -----------------------------------------------------------------------


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        NativeAnchorIndex(min_match=1, max_match=4, prompt_tail=0, sources=("nope",))
    with pytest.raises(ValueError, match="max_match=1: expected an int >= 2"):
        NativeAnchorIndex(min_match=2, max_match=1, prompt_tail=0, sources=SOURCES)
    with pytest.raises(ValueError, match="prompt_tail=-1"):
        NativeAnchorIndex(min_match=1, max_match=4, prompt_tail=-1, sources=SOURCES)
    idx = NativeAnchorIndex(min_match=1, max_match=4, prompt_tail=0, sources=SOURCES)
    with pytest.raises(ValueError, match="one weight per sequence"):
        idx.set_history("p", _arrays([[1, 2]]), [])
    with pytest.raises(ValueError, match="weight 0 < 1"):
        idx.add_global(0, _arrays([[1, 2]]), [0])
    with pytest.raises(ValueError, match="token id -3 is negative"):
        idx.add_sibling("p", np.array([1, -3], dtype=np.int32), 1)
    with pytest.raises(ValueError, match="one budget per request"):
        idx.draft_batch(["r"], [])
    with pytest.raises(IndexError):
        idx.draft_batch(["unknown"], [4])


def test_native_constants_mirror_the_reference():
    from sglang_histospec.drafting import _native, anchors

    assert len(_native.ANCHOR_CONSTANTS) == 18
    for name, value in _native.ANCHOR_CONSTANTS.items():
        assert value == getattr(anchors, name), name


def test_numpy_and_list_inputs_agree():
    idx = NativeAnchorIndex(min_match=1, max_match=8, prompt_tail=1, sources=("history", "self"))
    idx.set_history("p", _arrays([[7, 1, 2, 3, 1, 2, 4]]), [WEIGHT_ONE])
    idx.start("a", "p", [5, 7])
    idx.start("b", "p", np.array([5, 7], dtype=np.int64))
    idx.extend("a", [1])
    idx.extend("b", np.array([1], dtype=np.int32))
    assert idx.draft_batch(["a"], [6]) == idx.draft_batch(["b"], [6]) != [([], [], [], 0, "")]


def test_drafts_survive_concurrent_source_replacement():
    """Drafting threads keep working while another thread replaces the prompt's history and siblings."""
    idx = NativeAnchorIndex(min_match=1, max_match=16, prompt_tail=0, sources=SOURCES)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 20, size=600, dtype=np.int32)
    variants = [np.where(rng.random(600) < 0.1, 7, base).astype(np.int32) for _ in range(4)]
    idx.set_history("p", variants, [WEIGHT_ONE] * 4)
    for r in range(3):
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
                pos = 5 + (pos + 3) % 590
        except BaseException as exc:  # noqa: BLE001 - surfaced to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for i in range(30):
        idx.set_history("p", variants[i % 4 :], [WEIGHT_ONE] * (4 - i % 4))
        idx.add_sibling("p", variants[i % 4], WEIGHT_ONE)
        if i % 7 == 0:
            idx.clear_siblings()
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert idx.check_integrity() is None


def test_running_siblings_under_concurrent_starts_and_ends():
    """Threads start, extend, draft and end requests of one prompt at once: drafts read the others in place, under
    their locks (a deadlock would leave a thread alive)."""
    idx = NativeAnchorIndex(min_match=1, max_match=16, prompt_tail=1, sources=("running", "self"))
    base = np.random.default_rng(1).integers(0, 12, size=400).tolist()

    def worker(w: int) -> None:
        for i in range(40):
            rid = f"w{w}-{i}"
            idx.start(rid, "p", [3, 9])
            for pos in range(0, 60, 4):
                toks, parents, probs, _, _ = idx.draft_batch([rid], [8])[0]
                assert len(toks) == len(parents) == len(probs) <= 8
                idx.extend(rid, base[(w + i + pos) % 300 :][:4])
            idx.remove_request(rid)

    run_threads(worker, 4)
    assert idx.check_integrity() is None
