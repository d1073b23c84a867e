"""Target-distribution processing and the tree verifier on hand-made distributions and trees (no model)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as scipy_stats
import torch

from sglang_histospec.engine.sampling import process_logits, sample_rows
from sglang_histospec.engine.treebatch import TreeBatch
from tests.helpers.engine_tools import reference_probs
from tests.helpers.sequential_verify import VerifyOutcome, verify_tree


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 5, 1.0), (1.0, -1, 0.9), (1.3, 10, 0.8), (0.0, 3, 0.5), (1.0, 1, 1.0)],
)
def test_process_logits_matches_reference(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, size=(6, 40)).astype(np.float32)
    r = logits.shape[0]
    got = process_logits(
        torch.from_numpy(logits),
        torch.full((r,), temperature),
        torch.full((r,), top_k, dtype=torch.int64),
        torch.full((r,), top_p),
    ).numpy()
    for i in range(r):
        np.testing.assert_allclose(
            got[i], reference_probs(logits[i].astype(np.float64), temperature, top_k, top_p), atol=1e-6
        )


def test_process_logits_docstring_example():
    got = process_logits(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([1.0]), torch.tensor([2]), torch.tensor([1.0]))
    np.testing.assert_allclose(got.numpy(), [[0.731, 0.269, 0.0]], atol=1e-3)


def test_greedy_docstring_example():
    p = np.full((4, 10), 0.01)
    p[0, 7] = 0.9
    p[1, 9] = 0.9
    out = verify_tree(p, [0, 7, 8, 3], [-1, 0, 0, 1], True, None)
    assert out.accepted_nodes == [1] and out.tokens == [7, 9]
    np.testing.assert_allclose(out.logprobs, np.log([0.9, 0.9]))


def _context_probs(rng, vocab, zero_tokens=()):
    q = rng.dirichlet(np.full(vocab, 0.7))
    q[list(zero_tokens)] = 0.0
    return q / q.sum()


# Trees over vocabulary 8: (tokens, parents); node 0 is the root. "right" drafts put likely tokens first, "wrong"
# ones put tokens of zero or tiny probability first, duplicate siblings, and deep chains behind wrong tokens.
TREES = {
    "leaf_only": ([0], [-1]),
    "chain": ([0, 3, 4, 5], [-1, 0, 1, 2]),
    "wide": ([0, 6, 1, 2, 7, 4], [-1, 0, 0, 0, 1, 2]),
    "wrong_first_and_duplicates": ([0, 0, 0, 6, 1, 5, 5], [-1, 0, 0, 0, 3, 3, 4]),
}


def _batched_verify(probs, tokens, parents, greedy, rng):
    """The engine's batched form (one draw per node, then a walk), shaped like ``verify_tree``'s outcome."""
    q = torch.from_numpy(probs)
    picked = q.argmax(-1) if greedy else sample_rows(q, torch.from_numpy(rng.random(len(tokens))))
    [walk] = TreeBatch.build([(tokens, parents)], [tokens[0]]).walk(picked.numpy())
    return VerifyOutcome(
        walk.accepted_nodes, walk.tokens, [float(np.log(probs[r, t])) for r, t in zip(walk.rows, walk.tokens)]
    )


VERIFIERS = {"sequential": verify_tree, "batched": _batched_verify}


@pytest.mark.parametrize("verifier", sorted(VERIFIERS))
@pytest.mark.parametrize("name", sorted(TREES))
def test_verify_tree_is_lossless(name, verifier):
    """The first two emitted tokens follow q(root) and q(child) exactly (chi-square over 20000 walks), for the
    per-request reference and for the engine's batched form."""
    tokens, parents = TREES[name]
    vocab, n_walks = 8, 20000
    rng = np.random.default_rng(1)
    # token 0 has zero probability at the root: drafting it must never emit it
    probs = np.stack([_context_probs(rng, vocab, zero_tokens=(0,) if i == 0 else ()) for i in range(len(tokens))])
    walk_rng = np.random.default_rng(2)
    first = np.zeros(vocab, dtype=np.int64)
    second: dict[int, np.ndarray] = {}
    for _ in range(n_walks):
        out = VERIFIERS[verifier](probs, tokens, parents, False, walk_rng)
        first[out.tokens[0]] += 1
        if len(out.tokens) > 1:
            node = out.accepted_nodes[0]
            second.setdefault(node, np.zeros(vocab, dtype=np.int64))[out.tokens[1]] += 1
        # every emitted token's logprob is its node's q
        path = [0, *out.accepted_nodes]
        for k, tok in enumerate(out.tokens):
            assert out.logprobs[k] == pytest.approx(np.log(probs[path[k], tok]))
    _assert_follows(first, probs[0])
    children = [i for i in range(1, len(tokens)) if parents[i] == 0]
    first_child_of = {}
    for c in children:  # the first sibling with a token is the one tried (a duplicate is never accepted)
        first_child_of.setdefault(tokens[c], c)
    for node, counts in second.items():
        assert first_child_of[tokens[node]] == node
        if counts.sum() >= 500:
            _assert_follows(counts, probs[node])


def _assert_follows(counts: np.ndarray, p: np.ndarray) -> None:
    assert counts[p == 0].sum() == 0, f"zero-probability tokens emitted: {counts} vs {p}"
    n = counts.sum()
    expected = p * n
    big = expected >= 5  # chi-square cells; the rest pooled
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    pval = scipy_stats.chisquare(obs, exp).pvalue
    assert pval > 1e-4, f"p={pval}: observed {obs}, expected {np.round(exp, 1)}"


@pytest.mark.parametrize("verifier", sorted(VERIFIERS))
def test_verify_tree_greedy_takes_the_argmax_path(verifier):
    probs = np.full((5, 6), 0.1)
    probs[0, 2] = probs[2, 4] = probs[3, 1] = 0.5
    # root children 3 (wrong) and 2 (right); under 2: 4 (right); under 4: 5 (wrong); argmax after 4 is 1
    out = VERIFIERS[verifier](probs, [0, 3, 2, 4, 5], [-1, 0, 0, 2, 3], True, None)
    assert out.accepted_nodes == [2, 3] and out.tokens == [2, 4, 1]


def test_sample_rows_docstring_example():
    got = sample_rows(torch.tensor([[0.2, 0.0, 0.8]]), torch.tensor([0.5], dtype=torch.float64))
    assert got.tolist() == [2]


@pytest.mark.parametrize(
    "probs, u, expected",
    [
        ([[0.5, 0.5]], [0.0], [0]),
        ([[0.5, 0.5]], [0.4999], [0]),
        ([[0.5, 0.5]], [0.5], [1]),
        ([[0.3, 0.7, 0.0]], [0.999999999], [1]),  # the top of the CDF never lands on a zero-probability token
        ([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [0.0, 0.9], [2, 0]),
    ],
)
def test_sample_rows_is_an_inverse_cdf(probs, u, expected):
    got = sample_rows(torch.tensor(probs), torch.tensor(u, dtype=torch.float64))
    assert got.tolist() == expected


def test_sample_rows_chunks_large_vocabularies(monkeypatch):
    import sglang_histospec.engine.sampling as sampling

    probs = torch.softmax(torch.randn(7, 4, generator=torch.Generator().manual_seed(0)), -1)
    u = torch.rand(7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(sampling, "_CHUNK", 8)  # 2 rows of vocabulary 4 per chunk
    chunked = sample_rows(probs, u)
    monkeypatch.setattr(sampling, "_CHUNK", 1 << 22)
    assert chunked.tolist() == sample_rows(probs, u).tolist()
