"""The verifier (engine/verifier.py): greedy and seeded draws per node, the walk, logprobs of emitted tokens."""

from __future__ import annotations

import numpy as np
import torch

from sglang_histospec.engine import GenerateRequest, SamplingParams
from sglang_histospec.engine.request import RequestState
from sglang_histospec.engine.sampling import process_logits, sample_rows
from sglang_histospec.engine.treebatch import TreeBatch
from sglang_histospec.engine.verifier import verify

V = 8


def _state(temperature=0.0, seed=0, return_logprob=True, output=()):
    req = GenerateRequest(
        rid="r",
        input_ids=[1],
        return_logprob=return_logprob,
        sampling=SamplingParams(temperature=temperature, seed=seed),
    )
    st = RequestState(req=req, rng=np.random.default_rng(seed), tokens=[1, *output], stop_ids=frozenset())
    st.output = list(output)
    return st


def _logits(argmaxes):
    out = torch.zeros(len(argmaxes), V)
    out[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 4.0
    return out


def test_docstring_example():
    tb = TreeBatch.build([([0, 7], [-1, 0])], root_tokens=[5])
    v = verify([_state()], tb, _logits([7, 3]))
    assert v.walks[0].tokens == [7, 3] and v.walks[0].accepted_nodes == [1]
    expected = torch.log_softmax(_logits([7, 3]).double(), -1)[[0, 1], [7, 3]]
    assert np.allclose(v.logprobs, expected.tolist())


def test_greedy_rejects_a_wrong_child_and_emits_the_argmax():
    """Root -> 7 (node 1), root -> 2 (node 2): the root's argmax is 2, node 2's is 6."""
    tb = TreeBatch.build([([0, 7, 2], [-1, 0, 0]), None], root_tokens=[5, 4])
    no_lp = _state(return_logprob=False)
    v = verify([_state(), no_lp], tb, _logits([2, 0, 6, 1]))
    assert [(w.accepted_nodes, w.tokens, w.rows) for w in v.walks] == [([2], [2, 6], [0, 2]), ([], [1], [3])]
    assert len(v.logprobs) == 3  # every emitted token; the commit keeps those of requests that asked
    assert verify([no_lp], TreeBatch.build([None], [4]), _logits([1])).logprobs is None


def test_sampled_nodes_draw_with_the_uniform_of_their_depth():
    """A seeded request with 3 tokens out: node i at depth d draws with uniform 3 + d of its stream, so the root
    and both depth-1 siblings share one uniform."""
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    tb = TreeBatch.build([([0, 3, 4, 5], [-1, 0, 0, 1])], root_tokens=[2])
    st = _state(temperature=1.0, seed=11, output=(6, 6, 6))
    v = verify([st], tb, logits)
    u = np.random.default_rng(11).random(64)[[3, 4, 4, 5]]
    probs = process_logits(logits, torch.ones(4), torch.full((4,), -1), torch.ones(4))
    drawn = sample_rows(probs, torch.from_numpy(u)).tolist()
    w = v.walks[0]
    assert w.tokens[0] == drawn[0] and w.tokens[-1] == drawn[w.rows[-1]]
    assert len(st.uniforms) == 64  # one block of the stream, as the engine always drew it


def test_greedy_and_sampled_requests_in_one_batch():
    torch.manual_seed(1)
    logits = torch.randn(3, V)
    tb = TreeBatch.build([None, ([0, 1], [-1, 0])], root_tokens=[2, 3])
    greedy, sampled = _state(), _state(temperature=1.0, seed=5)
    v = verify([greedy, sampled], tb, logits)
    assert v.walks[0].tokens == [int(logits[0].argmax())]
    alone = verify([_state(temperature=1.0, seed=5)], TreeBatch.build([([0, 1], [-1, 0])], [3]), logits[1:])
    assert v.walks[1].tokens == alone.walks[0].tokens  # a request's draws do not depend on its neighbours


def test_uniforms_at_follows_output_position_and_seed_offset():
    st = _state(temperature=1.0, seed=3, output=(6, 6))
    st.skip = 5  # resumed after 5 tokens emitted elsewhere
    stream = np.random.default_rng(3).random(64)
    assert st.uniforms_at(np.array([0, 1, 1])).tolist() == stream[[7, 8, 8]].tolist()
    assert st.pending == 2 and len(st.uniforms) == 64  # tokens [1, 6, 6]: all but the root to prefill
