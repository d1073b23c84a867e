"""Hypothesis properties of the reference drafter's output (docs/drafting.md invariants)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter

tokens = st.lists(st.integers(0, 4), min_size=0, max_size=12)
histories = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=12), min_size=1, max_size=5)


def count(seqs: list[list[int]], pattern: list[int]) -> int:
    """Number of occurrences of ``pattern`` in ``seqs`` (all weights equal): an independent brute force."""
    n = len(pattern)
    return sum(1 for s in seqs for i in range(len(s) - n + 1) if s[i : i + n] == pattern)


@settings(max_examples=150, deadline=None)
@given(
    history=histories,
    prompt=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    generated=tokens,
    budget=st.integers(0, 12),
    tree=st.booleans(),
    min_prob=st.sampled_from([0.05, 0.1, 0.3, 1.0]),
    min_match=st.integers(1, 3),
    tail=st.integers(0, 3),
)
def test_history_draft_invariants(history, prompt, generated, budget, tree, min_prob, min_match, tail):
    cfg = DrafterConfig(
        scorer="counts",
        backend="python",
        sources=("history",),
        tree=tree,
        min_prob=min_prob,
        min_match=min_match,
        max_match=6,
        prompt_tail=tail,
    )
    d = HistoSpecDrafter(cfg)
    d.add("p", 0, history, prompt_tokens=prompt)
    d.start("r", "p", prompt)
    d.extend("r", generated)
    draft = d.draft("r", budget)
    assert draft.check() is None
    assert len(draft) <= budget
    ctx = prompt + generated
    seqs = [(prompt[len(prompt) - tail :] if tail else []) + h for h in history]
    if not draft.token_ids:
        # no suffix in [min_match, 6] has a continuation with probability >= min_prob
        for n in range(min_match, min(6, len(ctx)) + 1):
            pat = ctx[len(ctx) - n :]
            total = count(seqs, pat)
            assert budget == 0 or total == 0 or all(count(seqs, pat + [t]) / total < min_prob for t in range(5))
        return
    m = draft.match_len
    assert min_match <= m <= min(6, len(ctx)) and draft.source == "history"
    pattern = ctx[len(ctx) - m :]
    total = count(seqs, pattern)
    for i, p in enumerate(draft.probs):
        path = draft.path(i)
        # path probability = count(pattern + path) / count(pattern) (products telescope), >= min_prob
        assert abs(p - count(seqs, pattern + path) / total) < 1e-12
        assert min_prob <= p <= 1.0
        if draft.parents[i] >= 0:
            assert p <= draft.probs[draft.parents[i]]
    if not tree:
        assert draft.parents == list(range(-1, len(draft) - 1))
    # no longer suffix had a non-empty expansion
    for n in range(m + 1, min(6, len(ctx)) + 1):
        pat = ctx[len(ctx) - n :]
        tot = count(seqs, pat)
        assert tot == 0 or all(count(seqs, pat + [t]) / tot < min_prob for t in range(5))
    # distinct siblings
    seen = set()
    for i in range(len(draft)):
        key = (draft.parents[i], draft.token_ids[i])
        assert key not in seen
        seen.add(key)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(["add", "start", "finish", "end"]), st.integers(0, 3), tokens), max_size=25)
)
def test_bookkeeping_invariants(ops):
    d = HistoSpecDrafter(DrafterConfig(backend="python", window=2, capacity_tokens=40, prompt_tail=2, scorer="counts"))
    live: list[str] = []
    for k, (op, x, toks) in enumerate(ops):
        if op == "add":
            d.add(f"p{x}", k, [toks, toks[::-1]], rewards=[float(x), 0.0])
        elif op == "start":
            d.start(f"r{k}", f"p{x}", toks)
            live.append(f"r{k}")
        elif op == "finish" and live:
            d.finish(live.pop(0), toks)
        elif op == "end":
            d.end_step()
        assert d.check_integrity() is None
        assert d.stats()["history_tokens"] <= 40


@settings(max_examples=100, deadline=None)
@given(
    context=st.lists(st.integers(0, 3), min_size=1, max_size=16),
    budget=st.integers(1, 8),
    tree=st.booleans(),
)
def test_self_source_brute_force(context, budget, tree):
    d = HistoSpecDrafter(
        DrafterConfig(backend="python", sources=("self",), tree=tree, max_match=5, min_prob=0.05, scorer="counts")
    )
    d.start("r", None, context)
    draft = d.draft("r", budget)
    assert draft.check() is None and len(draft) <= budget
    n = len(context)
    n = len(context)
    # with at most 16 tokens every child has q >= 1/16 > min_prob, so a suffix that occurs elsewhere drafts
    if not draft.token_ids:
        assert all(count([context], context[n - k :]) == 1 for k in range(1, min(5, n) + 1))
        return
    m = draft.match_len
    pattern = context[n - m :]
    total = count([context], pattern) - 1  # the occurrence at the very end is excluded
    for i, p in enumerate(draft.probs):
        assert abs(p - count([context], pattern + draft.path(i)) / total) < 1e-12
    # no longer suffix occurs elsewhere in the context
    for k in range(m + 1, min(5, n) + 1):
        assert count([context], context[n - k :]) == 1
