"""Sampling with HistoSpec is lossless: at T=1 with top-p and with top-k, the tokens the engine emits (with no
drafts, with deliberately right drafts and with deliberately wrong drafts) follow the exact processed
distribution of the model, computed from a plain transformers forward. Chi-square tests, fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as scipy_stats
import torch

from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams
from sglang_histospec.engine.engine import Engine
from tests.helpers.engine_tools import FixedBudgets, ScriptedDrafter, reference_probs
from tests.helpers.tiny import make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 32
PROMPT = [1, 10, 11, 12]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp("dist"), arch="llama", vocab_size=VOCAB, seed=5)
    return path, AutoModelForCausalLM.from_pretrained(path).eval()


def exact_distributions(hf, sampling: SamplingParams):
    """q1[t1], q12[t1, t2] (joint of the first two tokens) and q3[t3] (marginal of the third) under processing."""

    def proc(logits):
        return np.stack([reference_probs(row, sampling.temperature, sampling.top_k, sampling.top_p) for row in logits])

    with torch.no_grad():
        l1 = hf(torch.tensor([PROMPT])).logits[0, -1].double().numpy()
        q1 = proc(l1[None])[0]
        seqs = torch.tensor([[*PROMPT, t] for t in range(VOCAB)])
        q2 = proc(hf(seqs).logits[:, -1].double().numpy())  # [t1, t2]
        seqs3 = torch.tensor([[*PROMPT, a, b] for a in range(VOCAB) for b in range(VOCAB)])
        q3 = proc(hf(seqs3).logits[:, -1].double().numpy()).reshape(VOCAB, VOCAB, VOCAB)
    q12 = q1[:, None] * q2
    return q1, q12, np.einsum("ab,abc->c", q12, q3), q2


def chi2_pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    counts, p = counts.ravel(), p.ravel()
    assert counts[p <= 1e-12].sum() == 0, "a token outside the processed support was emitted"
    exp = p * counts.sum()
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    if ex[-1] < 1:
        obs, ex = obs[:-1], ex[:-1]
        ex = ex * obs.sum() / ex.sum()
    return float(scipy_stats.chisquare(obs, ex).pvalue)


def sample(path, sampling, n, mode, refs):
    if mode == "plain":
        engine = Engine(
            EngineConfig(model_path=path, device="cpu", speculative_algorithm="NONE", max_running_requests=512)
        )
    else:
        drafter = ScriptedDrafter(refs, vocab_size=VOCAB, branch=2, wrong_first=mode == "wrong")
        engine = Engine(
            EngineConfig(
                model_path=path,
                device="cpu",
                max_running_requests=512,
                record_responses=False,
                draft_selection="always",
            ),
            drafter=drafter,
            budgets=FixedBudgets(4),
        )
    reqs = [
        GenerateRequest(
            rid=f"s{i}",
            input_ids=PROMPT,
            prompt_id="p",
            sampling=SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_new_tokens=3,
                ignore_eos=True,
                seed=i,
            ),
        )
        for i in range(n)
    ]
    res = engine.generate(reqs)
    out = np.array([r.output_ids for r in res])
    return out, engine.stats()


def check(model, sampling, n, mode):
    path, hf = model
    q1, q12, q3, q2 = exact_distributions(hf, sampling)
    # right drafts: the most likely continuation; wrong drafts: tokens outside the top-p / top-k support first
    a = int(np.argmax(q1))
    b = int(np.argmax(q2[a]))
    least = [int(np.argmin(q1)), int(np.argmin(q2[a]))]
    refs = {"p": [a, b, 7]} if mode == "right" else {"p": least + [3]}
    out, stats = sample(path, sampling, n, mode, refs)
    if mode != "plain":
        assert stats["draft_tokens"] > 0
        if mode == "right":
            assert stats["accepted_tokens"] > 0
    c1 = np.bincount(out[:, 0], minlength=VOCAB)
    c12 = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    np.add.at(c12, (out[:, 0], out[:, 1]), 1)
    c3 = np.bincount(out[:, 2], minlength=VOCAB)
    for name, counts, p in (("t1", c1, q1), ("t1,t2", c12, q12), ("t3", c3, q3)):
        pval = chi2_pvalue(counts, p)
        assert pval > 1e-4, f"{mode} {sampling}: {name} p-value {pval}"


SETTINGS = {
    "top_p_0.9": SamplingParams(temperature=1.0, top_p=0.9),
    "top_k_5": SamplingParams(temperature=1.0, top_k=5),
}


@pytest.mark.parametrize("mode", ["plain", "right", "wrong"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_sampling_distribution_is_exact(model, setting, mode):
    check(model, SETTINGS[setting], 3000, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "right", "wrong"])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.7, top_k=12, top_p=0.95),
        SamplingParams(temperature=1.0),
    ],
)
def test_sampling_distribution_is_exact_large(model, sampling, mode):
    check(model, sampling, 20000, mode)
