"""Greedy outputs: the engine equals HF greedy decoding, and HistoSpec equals no drafting, token for token."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams
from sglang_histospec.engine.engine import Engine
from sglang_histospec.engine.governor import GovernorConfig
from sglang_histospec.engine.types import DraftPolicyConfig
from tests.helpers.engine_tools import FixedBudgets, ScriptedDrafter
from tests.helpers.tiny import make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 64


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("greedy")
    return {
        arch: make_tiny_model_dir(root / arch, arch=arch, vocab_size=VOCAB, seed=3)
        for arch in ("llama", "qwen2", "qwen3")
    }


_PLAIN: dict = {}


def plain_outputs(path, ps):
    """Outputs without drafting (cached per model and prompt set)."""
    key = (path, tuple(map(tuple, ps)))
    if key not in _PLAIN:
        _PLAIN[key] = run(path, "NONE", ps)[0]
    return _PLAIN[key]


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(4, VOCAB, size=int(rng.integers(0, 12))).tolist()] for _ in range(n)]


def requests(ps, max_new=24, tag="", ignore_eos=None):
    return [
        GenerateRequest(
            rid=f"{tag}r{i}",
            input_ids=p,
            prompt_id=f"p{i}",
            sampling=SamplingParams(
                temperature=0.0, max_new_tokens=max_new, ignore_eos=i % 2 == 0 if ignore_eos is None else ignore_eos
            ),
        )
        for i, p in enumerate(ps)
    ]


def run(path, alg, ps, drafter=None, budget=0, max_running=64, **kw):
    cfg = EngineConfig(
        model_path=path, device="cpu", speculative_algorithm=alg, max_running_requests=max_running, **kw
    )
    budgets = FixedBudgets(budget) if drafter is not None else None
    engine = Engine(cfg, drafter=drafter, budgets=budgets)
    return engine.generate(requests(ps)), engine


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_plain_engine_equals_hf_greedy(model_dirs, arch):
    from transformers import AutoModelForCausalLM

    ps = prompts(6, seed=1)
    results, _ = run(model_dirs[arch], "NONE", ps)
    hf = AutoModelForCausalLM.from_pretrained(model_dirs[arch]).eval()
    for p, res, req in zip(ps, results, requests(ps)):
        out = hf.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=None if req.sampling.ignore_eos else 2,
            pad_token_id=0,
        )[0, len(p) :].tolist()
        assert res.output_ids == out


CASES = [  # (arch, drafter kind, branch, wrong_first, budget, max_running)
    ("llama", "right", 1, False, 1, 64),
    ("llama", "right", 1, False, 16, 5),
    ("llama", "right", 3, False, 4, 1),
    ("llama", "right", 2, True, 16, 3),
    ("llama", "wrong", 3, True, 16, 7),
    ("qwen2", "right", 3, True, 8, 64),
    ("qwen2", "wrong", 1, False, 4, 64),
    ("qwen3", "right", 2, False, 6, 4),
]
SLOW_CASES = [
    (arch, kind, branch, wrong_first, budget, max_running)
    for arch in ("llama", "qwen2", "qwen3")
    for kind in ("right", "wrong")
    for branch, wrong_first in ((1, False), (3, False), (3, True))
    for budget in (1, 4, 16)
    for max_running in (1, 7, 64)
]


def check_histospec_equals_plain(model_dirs, arch, kind, branch, wrong_first, budget, max_running):
    ps = prompts(20, seed=2)
    plain = plain_outputs(model_dirs[arch], ps)
    refs = {f"p{i}": r.output_ids for i, r in enumerate(plain)}
    if kind == "wrong":  # the reference shifted after 3 tokens: the first tokens are accepted, then drafts go wrong
        refs = {k: v[:3] + [(t + 1) % VOCAB for t in v[3:]] for k, v in refs.items()}
    drafter = ScriptedDrafter(refs, vocab_size=VOCAB, branch=branch, wrong_first=wrong_first)
    spec, engine = run(
        model_dirs[arch],
        "HISTOSPEC",
        ps,
        drafter=drafter,
        budget=budget,
        max_running=max_running,
        draft_selection="always",
    )
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    assert [r.finish_reason for r in spec] == [r.finish_reason for r in plain]
    stats = engine.stats()
    assert stats["draft_tokens"] > 0
    if kind == "right" and not wrong_first:
        assert stats["accepted_tokens"] > 0.5 / branch * stats["draft_tokens"]
        assert stats["tau"] > 1.5
    # finished responses were recorded under their prompt ids
    assert drafter.finished == {r.rid: r.output_ids for r in spec}


@pytest.mark.parametrize("arch, kind, branch, wrong_first, budget, max_running", CASES)
def test_histospec_equals_plain_scripted(model_dirs, arch, kind, branch, wrong_first, budget, max_running):
    check_histospec_equals_plain(model_dirs, arch, kind, branch, wrong_first, budget, max_running)


@pytest.mark.slow
@pytest.mark.parametrize("arch, kind, branch, wrong_first, budget, max_running", SLOW_CASES)
def test_histospec_equals_plain_scripted_matrix(model_dirs, arch, kind, branch, wrong_first, budget, max_running):
    check_histospec_equals_plain(model_dirs, arch, kind, branch, wrong_first, budget, max_running)


@pytest.mark.parametrize("arch, selection", [("llama", "always"), ("qwen3", "always"), ("llama", "adaptive")])
def test_histospec_equals_plain_with_history_drafter(model_dirs, arch, selection):
    """The real HistoSpecDrafter over three epochs of the same prompts: identical outputs; with every drafted node
    verified, tau above 2 once history exists (the default cost-aware cut sizes drafts by measured time, so only
    its outputs are asserted)."""
    ps = prompts(16, seed=4)
    plain = plain_outputs(model_dirs[arch], ps)
    engine = Engine(
        EngineConfig(model_path=model_dirs[arch], device="cpu", max_running_requests=6, draft_selection=selection)
    )
    taus = []
    for epoch in range(3):
        res = engine.generate(requests(ps, tag=f"e{epoch}"))
        engine.drafter.end_step(epoch)
        assert [r.output_ids for r in res] == [r.output_ids for r in plain], f"epoch {epoch}"
        taus.append(sum(r.completion_tokens for r in res) / sum(r.spec_verify_ct for r in res))
    if selection == "always":
        assert taus[1] > 2.0 and taus[2] > 2.0, taus
    assert engine.drafter.stats()["prompts"] == len(ps)


def _run_with_cut(model_dirs, ps, selection, row_cost):
    from sglang_histospec.drafting.draft_cut import StepCostModel

    refs = {f"p{i}": r.output_ids for i, r in enumerate(plain_outputs(model_dirs["llama"], ps))}
    drafter = ScriptedDrafter(refs, vocab_size=VOCAB, branch=2, wrong_first=False)
    # the cut alone: no explore budget (it would hold the first steps plain until this engine's plain steps are fitted)
    gov = GovernorConfig(explore_budget=math.inf)
    cfg = EngineConfig(
        model_path=model_dirs["llama"], device="cpu", draft_selection=selection, policy=DraftPolicyConfig(governor=gov)
    )
    engine = Engine(cfg, drafter=drafter, budgets=FixedBudgets(8))
    model = StepCostModel()
    for extra in (0, 10) * 16:  # a ready model: 50 ms per step (far above the drafting time), row_cost per extra row
        model.observe(4, 4 + extra, 0.05 + row_cost * extra)
    model.observe = lambda *a, **k: None  # keep the primed costs for the whole run
    engine.policy.step_cost = model
    return engine.generate(requests(ps)), engine.stats()


@pytest.mark.parametrize("row_cost, fewer", [(1.0, True), (0.0, False)])
def test_cost_cut_keeps_outputs_and_sizes_trees(model_dirs, row_cost, fewer):
    """The cost-aware cut: rows priced far above a step's tokens cut drafts (all but those riding on a step that
    already prefills), free rows keep them all; outputs equal plain decoding either way."""
    ps = prompts(8, seed=5)
    plain = [r.output_ids for r in plain_outputs(model_dirs["llama"], ps)]
    cut, cut_stats = _run_with_cut(model_dirs, ps, "adaptive", row_cost)
    every, every_stats = _run_with_cut(model_dirs, ps, "always", row_cost)
    assert [r.output_ids for r in cut] == plain and [r.output_ids for r in every] == plain
    assert cut_stats["step_cost"]["ready"] and every_stats["draft_tokens"] > 0
    if fewer:  # nothing pays for its rows: drafting pauses (1, 2, 4, ... steps without drafting work)
        assert cut_stats["draft_tokens"] < every_stats["draft_tokens"] / 2
        assert cut_stats["verify_steps"] > every_stats["verify_steps"]
        assert cut_stats["step_cost"]["draft_pauses"] > 0 and cut_stats["step_cost"]["paused_steps"] > 0
    else:
        assert cut_stats["draft_tokens"] == every_stats["draft_tokens"]
        assert cut_stats["step_cost"]["paused_steps"] == 0


def test_default_budget_follows_draft_selection(model_dirs):
    cut = Engine(EngineConfig(model_path=model_dirs["llama"], device="cpu", num_draft_tokens=12))
    assert (
        cut.policy.budgets.cfg.policy == "fixed"
        and cut.policy.budgets.cfg.fixed == 12
        and cut.policy.budgets.cfg.cost_limit is None
    )
    keep_all = Engine(EngineConfig(model_path=model_dirs["llama"], device="cpu", draft_selection="always"))
    assert keep_all.policy.budgets.cfg.policy == "paper"
    with pytest.raises(ValueError, match="draft_selection"):
        EngineConfig(model_path=model_dirs["llama"], draft_selection="some")


def _sampled_requests(ps, tag=""):
    return [
        GenerateRequest(
            rid=f"{tag}s{i}",
            input_ids=p,
            prompt_id=f"p{i}",
            sampling=SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=24, seed=1000 + i),
        )
        for i, p in enumerate(ps)
    ]


@pytest.mark.parametrize("kind, branch, wrong_first", [("right", 2, False), ("wrong", 3, True), ("history", 0, False)])
def test_seeded_sampling_emits_the_same_tokens_with_and_without_drafts(model_dirs, kind, branch, wrong_first):
    """At T = 1 a seeded request draws output token j with its j-th uniform whatever the drafts, so HistoSpec
    emits exactly the tokens of plain decoding (a stronger check than equal distributions)."""
    ps = prompts(10, seed=6)
    cfg = dict(model_path=model_dirs["qwen2"], device="cpu", max_running_requests=4)
    plain = Engine(EngineConfig(speculative_algorithm="NONE", **cfg)).generate(_sampled_requests(ps))
    if kind == "history":  # the real drafter, fed the plain run's responses as the previous epoch
        engine = Engine(EngineConfig(**cfg, draft_selection="always"), budgets=FixedBudgets(6))
        for i, (p, r) in enumerate(zip(ps, plain)):
            engine.drafter.add(f"p{i}", 0, [r.output_ids], prompt_tokens=p)
    else:
        refs = {f"p{i}": r.output_ids for i, r in enumerate(plain)}
        if kind == "wrong":
            refs = {k: v[:2] + [(t + 1) % VOCAB for t in v[2:]] for k, v in refs.items()}
        drafter = ScriptedDrafter(refs, vocab_size=VOCAB, branch=branch, wrong_first=wrong_first)
        engine = Engine(EngineConfig(**cfg, draft_selection="always"), drafter=drafter, budgets=FixedBudgets(6))
    spec = engine.generate(_sampled_requests(ps))
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    stats = engine.stats()
    assert stats["draft_tokens"] > 0
    if kind != "wrong":
        assert stats["tau"] > 1.5
