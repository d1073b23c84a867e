"""HistoSpecGRPOTrainer against real rollout servers (``histospec serve --backend torch`` subprocesses, tiny model).

One HistoSpec server and one plain (``NONE``) server serve the whole module; every trainer syncs its own weights
before its first generation (TRL's ``_last_loaded_step = -1``), so tests do not depend on each other's weights.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import trl  # noqa: F401  (a hard test dependency: `make test` installs it; missing, it must fail)
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_histospec.demo.server_process import RolloutServerProcess
from sglang_histospec.drafting.prompt_ids import TOKEN_ID_PREFIX, token_prompt_id
from tests.helpers.tiny import make_char_tokenizer, make_tiny_model_dir
from tests.helpers.trl_harness import length_reward, tiny_dataset, tiny_grpo_kwargs
from trl_integration import (
    HistoSpecGRPOConfig,
    HistoSpecGRPOTrainer,
    RolloutServerUnreachable,
    TokenizerMismatch,
    make_rollout_func,
)

pytestmark = pytest.mark.usefixtures("trl_env")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return make_tiny_model_dir(tmp_path_factory.mktemp("trl") / "m", arch="llama", vocab_size=64, seed=0)


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """{"on": HISTOSPEC server, "off": NONE server}, started concurrently."""
    logs = tmp_path_factory.mktemp("trl-logs")
    with ThreadPoolExecutor(2) as pool:
        # every drafted node is verified: these tests check that pushed history turns into drafts, not the
        # engine's cost-aware cut (which may rightly stop drafting on this tiny random model; tests/test_engine_*)
        on = pool.submit(
            RolloutServerProcess,
            model_dir,
            speculative_algorithm="HISTOSPEC",
            log_path=str(logs / "on.log"),
            extra_args=["--draft-selection", "always"],
        )
        off = pool.submit(
            RolloutServerProcess, model_dir, speculative_algorithm="NONE", log_path=str(logs / "off.log")
        )
        procs = {"on": on.result(), "off": off.result()}
    yield procs
    for p in procs.values():
        p.stop()


def make_trainer(model_dir, url, out_dir, dataset=None, reward=length_reward, tokenizer=None, **overrides):
    torch.manual_seed(0)
    tok = tokenizer or AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    urls = url if isinstance(url, list) else [url]
    args = HistoSpecGRPOConfig(output_dir=str(out_dir), rollout_urls=urls, **tiny_grpo_kwargs(**overrides))
    return HistoSpecGRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset if dataset is not None else tiny_dataset(2),
        processing_class=tok,
    )


def step_logs(trainer):
    return [h for h in trainer.state.log_history if "loss" in h]


def test_training_steps_push_history_and_second_epoch_drafts(model_dir, servers, tmp_path):
    """2 prompts x 4 samples (temperature 0.3), one prompt per step, 4 steps = 2 epochs: weights synced before every
    generation, history pushed per step and growing in the first epoch, tau > 1 in the second and above the first's,
    trainer/server logprobs equal."""
    srv = servers["on"]
    ds = tiny_dataset(2, id_prefix="epoch-")
    before = srv.client.stats()["history"]["history_tokens"]
    trainer = make_trainer(
        model_dir,
        srv.url,
        tmp_path,
        dataset=ds,
        max_steps=4,
        max_completion_length=24,
        learning_rate=1e-5,
        temperature=0.3,
    )
    trainer.train()
    assert trainer.histospec.synced_steps == [0, 1, 2, 3]
    assert [step for step, _ in trainer.history_pushes] == [0, 1, 2, 3]
    assert all(n == 4 for _, n in trainer.history_pushes)
    logs = step_logs(trainer)
    assert len(logs) == 4
    history = [h["histospec/history_tokens"] for h in logs]
    assert history[0] > before and history[1] > history[0]  # first epoch: each step adds a new prompt's history
    assert [h["histospec/history_prompts"] for h in logs[:2]][1] >= 2
    # epoch 1 drafts only from the request's own context (and finished siblings); epoch 2 also from the history.
    # Seeds 0-3 gave epoch-1 tau 1.01-1.08 and epoch-2 tau 1.10-1.37 (accepted tokens 6-9 vs 28-36).
    first_epoch_tau = [h["histospec/tau"] for h in logs[:2]]
    second_epoch_tau = [h["histospec/tau"] for h in logs[2:]]
    assert min(second_epoch_tau) > 1.0, second_epoch_tau
    assert sum(second_epoch_tau) > sum(first_epoch_tau), (first_epoch_tau, second_epoch_tau)
    accepted = [h["histospec/accepted_tokens"] for h in logs]
    assert sum(accepted[2:]) > sum(accepted[:2]), accepted
    # TRL's importance-sampling figures: the server's sampling logprobs vs the trainer's, right after each sync
    for h in logs:
        assert h["sampling/sampling_logp_difference/max"] < 1e-4
        assert h["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)


def test_server_logprobs_equal_trainer_logprobs_after_sync(model_dir, servers, tmp_path):
    """After training moved the weights, one more sync: the server's logprob of each sampled token equals the
    trainer model's log-softmax at that position."""
    srv = servers["off"]
    trainer = make_trainer(
        model_dir, srv.url, tmp_path, dataset=tiny_dataset(2, id_prefix="lp-"), max_steps=2, learning_rate=5e-2
    )
    trainer.train()
    trainer.histospec.sync_weights()
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    moved = max((p - q).abs().max().item() for p, q in zip(model.parameters(), initial.parameters()))
    assert moved > 1e-3  # the comparison below is against trained, not initial, weights
    prompt = trainer.processing_class("what is 7+7?").input_ids
    [out] = trainer.servers.generate([prompt], ["lp-check"], trainer.histospec.sampling, return_logprob=True)
    ids = torch.tensor([prompt + out.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    mine = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(out.completion_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.logprobs), mine, atol=1e-4, rtol=0)


def test_greedy_completions_and_losses_identical_with_histospec_off_and_on(model_dir, servers, tmp_path):
    """top_k=1 (greedy) rollouts: the HistoSpec server and the plain server give the same completions, hence the
    same losses. Greedy groups have zero advantage, so weight decay moves the weights and beta > 0 makes the loss
    (the KL to the initial model) non-zero; the HistoSpec server accepts drafts in the second epoch."""
    runs = {}
    for name in ("off", "on"):
        ds = tiny_dataset(2, id_prefix=f"greedy-{name}-")
        trainer = make_trainer(
            model_dir,
            servers[name].url,
            tmp_path / name,
            dataset=ds,
            max_steps=4,
            top_k=1,
            max_completion_length=16,
            beta=0.1,
            weight_decay=0.5,
        )
        trainer.train()
        completions = [c.completion_ids for r in trainer.recent_generations for c in r.completions]
        runs[name] = (trainer, [h["loss"] for h in step_logs(trainer)], completions)
    (off, off_loss, off_completions), (on, on_loss, on_completions) = runs["off"], runs["on"]
    assert on_completions == off_completions and len(on_completions) == 16
    assert on_loss == pytest.approx(off_loss, abs=1e-6)
    assert any(abs(loss) > 1e-6 for loss in off_loss)  # the KL term makes the losses depend on the completions
    off_steps = [h for h in off.state.log_history if "completions/mean_length" in h]
    on_steps = [h for h in on.state.log_history if "completions/mean_length" in h]
    assert [h["completions/mean_length"] for h in on_steps] == [h["completions/mean_length"] for h in off_steps]
    assert all(h["histospec/drafted_tokens"] == 0 for h in off_steps)
    assert sum(h["histospec/accepted_tokens"] for h in on_steps[2:]) > 0


@pytest.mark.parametrize(
    ("grad_accum", "num_iterations", "synced_steps"),
    [
        pytest.param(2, 1, [0, 1, 2], marks=pytest.mark.slow),  # one generation (2 micro-batches) per optimizer step
        (2, 2, [0, 2]),  # gradient accumulation + num_iterations: each generation serves 2 optimizer steps
        pytest.param(1, 2, [0, 2], marks=pytest.mark.slow),  # num_iterations reuse: no sync on odd steps
    ],
)
def test_sync_and_push_follow_trl_generation_schedule(
    model_dir, servers, tmp_path, grad_accum, num_iterations, synced_steps
):
    """Weights sync only when TRL generates after an optimizer step; history is pushed once per generation."""
    trainer = make_trainer(
        model_dir,
        servers["off"].url,
        tmp_path,
        dataset=tiny_dataset(4, id_prefix=f"schedule-{grad_accum}-{num_iterations}-"),
        max_steps=3,
        gradient_accumulation_steps=grad_accum,
        num_iterations=num_iterations,
    )
    trainer.train()
    assert trainer.histospec.synced_steps == synced_steps
    assert [step for step, _ in trainer.history_pushes] == synced_steps
    per_generation = 4 * grad_accum  # per_device_train_batch_size * steps_per_generation
    assert all(n == per_generation for _, n in trainer.history_pushes)
    assert all(math.isfinite(h["loss"]) for h in step_logs(trainer))


def test_several_servers_get_weights_and_history_and_share_the_requests(model_dir, servers, tmp_path):
    """rollout_urls with two servers: each group goes to one server (by prompt id), weights and history to both."""
    before = [servers[k].client.stats() for k in ("on", "off")]
    urls = [servers["on"].url, servers["off"].url]
    trainer = make_trainer(model_dir, urls, tmp_path, dataset=tiny_dataset(2, id_prefix="multi-"))
    trainer.train()
    after = [servers[k].client.stats() for k in ("on", "off")]
    delta = [
        {k: a[k] - b[k] for k in ("requests", "history_responses_pushed", "weight_updates")}
        for a, b in zip(after, before)
    ]
    assert [d["weight_updates"] for d in delta] == [2, 2]
    assert [d["history_responses_pushed"] for d in delta] == [8, 8]
    assert sum(d["requests"] for d in delta) == 8
    for record in trainer.recent_generations:
        assert len({c.server for c in record.completions}) == 1  # one prompt per step: its group on one server
    assert [servers[k].client.model_info()["weight_version"] for k in ("on", "off")] == ["1", "1"]


def test_rollout_func_with_stock_grpo_trainer(model_dir, servers, tmp_path):
    """TRL's own rollout_func hook: weights synced lazily by the function, ids reach the reward function."""
    from trl import GRPOConfig, GRPOTrainer

    srv = servers["off"]
    seen: list[list[str]] = []

    def reward(completions, histospec_prompt_id, **kw):
        seen.append(list(histospec_prompt_id))
        return length_reward(completions)

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    rollout = make_rollout_func([srv.url])
    args = GRPOConfig(output_dir=str(tmp_path), **tiny_grpo_kwargs(max_steps=2))
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=tiny_dataset(2),
        processing_class=tok,
        rollout_func=rollout,
    )
    trainer.train()
    assert len(seen) == 2 and all(len(ids) == 4 and len(set(ids)) == 1 for ids in seen)
    assert seen[0][0].startswith(TOKEN_ID_PREFIX)  # no id column: the servers' rule on the prompt tokens
    info = srv.client.model_info()
    assert info["weight_version"] == "1"  # synced before the generations at global steps 0 and 1
    rollout.servers.close()


def test_unreachable_server_is_a_clear_error(model_dir, tmp_path):
    from sglang_histospec.server.launch import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RolloutServerUnreachable, match="unreachable.*histospec serve"):
        make_trainer(model_dir, url, tmp_path, server_ready_timeout=1)


def test_tokenizer_or_vocabulary_mismatch_is_a_clear_error(model_dir, servers, tmp_path):
    from sglang_histospec.models.demo_tokenizer import build_tokenizer

    with pytest.raises(TokenizerMismatch, match="encode .* differently"):
        make_trainer(model_dir, servers["off"].url, tmp_path, tokenizer=build_tokenizer())
    other = make_tiny_model_dir(tmp_path / "m80", vocab_size=80)
    with pytest.raises(TokenizerMismatch, match="vocab_size 80 .* vocab_size 64"):
        make_trainer(other, servers["off"].url, tmp_path, tokenizer=make_char_tokenizer(80))


def test_missing_prompt_ids_with_hashing_disabled_is_a_clear_error(model_dir, servers, tmp_path):
    trainer = make_trainer(
        model_dir, servers["off"].url, tmp_path, dataset=tiny_dataset(2, with_ids=False), hash_prompt_ids=False
    )
    with pytest.raises(ValueError, match="no 'prompt_id' column.*hash_prompt_ids=True"):
        trainer.train()


def test_hashed_prompt_ids_are_used_when_the_column_is_absent(model_dir, servers, tmp_path):
    trainer = make_trainer(model_dir, servers["off"].url, tmp_path, dataset=tiny_dataset(2, with_ids=False))
    trainer.train()
    for record in trainer.recent_generations:  # the id every server derives from the same tokens
        assert record.prompt_ids == [token_prompt_id(p) for p in record.prompt_token_ids]
    assert trainer.recent_generations


def test_trace_path_writes_each_step_and_the_trace_replays(model_dir, servers, tmp_path, capsys):
    """trace_path: every training generation is appended as one step (4 samples, rewards, logprobs), the file
    loads with the trace reader, and `histospec replay TRACE --json` runs on it; a new run on the path starts over."""
    from sglang_histospec.cli import main
    from sglang_histospec.trace.format import load_steps

    path = tmp_path / "run" / "trace.jsonl.gz"
    ds = tiny_dataset(2, id_prefix="trace-")
    trainer = make_trainer(
        model_dir, servers["on"].url, tmp_path / "out", dataset=ds, max_steps=3, trace_path=str(path)
    )
    trainer.train()
    steps, was_sorted = load_steps(path)
    assert was_sorted and [s.step for s in steps] == [0, 1, 2]
    for s in steps:
        assert len(s.records) == 4 and len({r.prompt_id for r in s.records}) == 1
        assert sorted(r.sample for r in s.records) == [0, 1, 2, 3]
        assert all(r.reward is not None and r.logprobs is not None for r in s.records)
        assert all(len(r.logprobs) == len(r.response) for r in s.records)
    assert {s.records[0].prompt_id for s in steps[:2]} == {"trace-0", "trace-1"}  # one epoch of 2 prompts
    capsys.readouterr()
    assert main(["replay", str(path), "--drafter", "histospec", "--budget", "8", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["responses"] == 12 and out["tau"] >= 1.0, out
    again = make_trainer(
        model_dir, servers["on"].url, tmp_path / "out2", dataset=ds, max_steps=1, trace_path=str(path)
    )
    again.train()  # a fresh run from step 0 on the same path starts the trace over
    assert [s.step for s in load_steps(path)[0]] == [0]
