"""Multi-epoch rollouts of the demo model on the demo task through the embedded engine, with a trace.

:func:`sample_epochs` runs one RL step per epoch with a frozen policy (epoch e+1 drafts from epoch e's history)
and can record the trace (docs/replay.md section 1) for replay and HistoPipe; ``trace/seeding.py`` builds the
seeded requests it shares with ``histospec bench engine``. GRPO training is ``histospec demo`` with the TRL trainer.

Example::

    stats = sample_epochs(model_dir, ArithTask(), RolloutConfig(epochs=3), "HISTOSPEC", trace_path="t.jsonl.gz")
    stats[-1].tau       # tokens per verify step in the last epoch (> 1 once history exists)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from sglang_histospec.drafting.types import AcceptanceRates
from sglang_histospec.engine.types import DRAFT_SELECTIONS
from sglang_histospec.tasks.arith import ArithTask
from sglang_histospec.trace.seeding import epoch_requests


@dataclass(frozen=True)
class RolloutConfig:
    """Shape of a multi-epoch sampling run."""

    epochs: int = 3
    """Epochs (= RL steps here: every epoch visits every prompt once)."""
    group_size: int = 4
    """Responses per prompt and epoch (GRPO's ``num_generations``)."""
    num_prompts: int | None = None
    """Use the first ``num_prompts`` prompts of the task; None = all."""
    max_new_tokens: int = 48
    """Completion length cap."""
    temperature: float = 1.0
    """Sampling temperature (1 = the policy's own distribution, as in RL rollouts)."""
    seed: int = 0
    """Base of every request's sampling seed."""
    max_running_requests: int = 64
    """Requests the engine decodes together."""
    num_draft_tokens: int = 16
    """Cap on draft nodes per request and verify step."""
    draft_selection: str = "adaptive"
    """The engine's ``draft_selection``: "adaptive" or "always"."""

    def __post_init__(self) -> None:
        for name in ("epochs", "group_size", "max_new_tokens", "max_running_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError(f"num_prompts={self.num_prompts}: must be >= 1 or None")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0")
        if self.draft_selection not in DRAFT_SELECTIONS:
            raise ValueError(f"draft_selection={self.draft_selection!r}: use one of {', '.join(DRAFT_SELECTIONS)}")


@dataclass
class EpochStats(AcceptanceRates):
    """What one epoch of rollouts did (``tau``: tokens per request-step, 1.0 without drafting)."""

    epoch: int
    mode: str
    """The engine's speculative algorithm: ``HISTOSPEC`` or ``NONE``."""
    responses: int
    mean_reward: float
    tokens: int
    """Generated tokens (EOS included)."""
    verify_steps: int
    """Request-steps: one per request per verify forward."""
    drafted: int
    accepted: int
    seconds: float
    """Wall time of the epoch's generation."""
    forward_passes: int | None = None
    """Batched verify forwards (what costs time), when the engine is in this process."""
    nll: float | None = None
    """Sum of -logprob of the sampled tokens, when the run asked for logprobs (see ``entropy``)."""
    plain_seconds: float | None = None
    """Side-by-side runs: wall time of the same requests replayed on a plain-decoding server with the same weights."""
    plain_tokens: int | None = None
    """Side-by-side runs: tokens the plain replay generated."""
    plain_reward: float | None = None
    """Side-by-side runs: mean reward of the plain replay's responses."""
    identical: int | None = None
    """Side-by-side runs: responses whose plain replay emitted exactly the same tokens."""

    @property
    def entropy(self) -> float | None:
        """Mean negative log-probability of the sampled tokens (nats): an estimate of the per-token entropy."""
        return self.nll / self.tokens if self.nll is not None and self.tokens else None

    def as_dict(self) -> dict:
        out = dict(vars(self))
        out.update(tau=self.tau, accept_rate=self.accept_rate, entropy=self.entropy)
        return out


def _run_requests(engine, requests: list, desc: str, progress: bool) -> tuple[dict, float]:
    """Decode ``requests`` to the end on ``engine``: (results by rid, wall seconds)."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    for r in requests:
        engine.add_request(r)
    results = {}
    bar = tqdm(total=len(requests), desc=desc, disable=not progress, unit="resp", leave=False)
    while engine.has_unfinished():
        for res in engine.step():
            results[res.rid] = res
            bar.update(1)
    bar.close()
    return results, time.perf_counter() - start


def _score_and_push(engine, task: ArithTask, prompts: list, prompt_ids: dict[str, list[int]], results: dict,
                    epoch: int, group_size: int, writer) -> list[float]:  # fmt: skip
    """Score every prompt's group of ``epoch``, push it with its rewards into the engine's history (and the trace
    ``writer`` when not None); returns the rewards in prompt, then sample order."""
    from sglang_histospec.trace.format import TraceRecord

    tokenizer = engine.tokenizer
    rewards = []
    for p in prompts:
        group = [results[f"e{epoch}-{p.prompt_id}-{k}"] for k in range(group_size)]
        texts = tokenizer.batch_decode([g.output_ids for g in group], skip_special_tokens=True)
        group_rewards = [task.reward(p.text, t) for t in texts]
        rewards += group_rewards
        engine.drafter.add(p.prompt_id, epoch, [g.output_ids for g in group], rewards=group_rewards)
        if writer is not None:
            for k, (g, r) in enumerate(zip(group, group_rewards)):
                response = list(g.output_ids)
                writer.write(
                    TraceRecord(epoch, p.prompt_id, k, prompt_ids[p.prompt_id], response, epoch=epoch, reward=r)
                )
    return rewards


def _epoch_stats(epoch: int, mode: str, responses: int, rewards: list[float], before: dict, after: dict,
                 seconds: float) -> EpochStats:  # fmt: skip
    """An epoch's figures from the engine's ``stats()`` before and after it."""

    def delta(key: str) -> int:
        return after[key] - before[key]

    return EpochStats(
        epoch=epoch,
        mode=mode,
        responses=responses,
        mean_reward=sum(rewards) / len(rewards),
        tokens=delta("generated_tokens"),
        verify_steps=delta("verify_steps"),
        forward_passes=delta("forward_passes"),
        drafted=delta("draft_tokens"),
        accepted=delta("accepted_tokens"),
        seconds=seconds,
    )


def sample_epochs(
    model_dir: str | os.PathLike,
    task: ArithTask,
    config: RolloutConfig,
    speculative_algorithm: str = "HISTOSPEC",
    trace_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> list[EpochStats]:
    """Run ``config.epochs`` epochs of rollouts through a fresh embedded engine; optionally write the trace.

    Each epoch samples ``group_size`` responses per prompt of the fixed prompt set at temperature 1 (one RL step
    per epoch), scores them with the task's reward, pushes them with their rewards into the engine's history
    drafter (as the TRL trainer does after each step) and closes the step, so epoch e+1 drafts from epoch e. The
    policy is frozen: this measures what history drafting gives a slowly moving policy. Every request has its own
    seed (:func:`epoch_requests`), so a run is reproducible and the runs with and without HistoSpec sample the same
    distribution with the same seeds.

    Returns one :class:`EpochStats` per epoch. ``speculative_algorithm`` is ``HISTOSPEC`` or ``NONE``.
    """
    from sglang_histospec.engine import EngineConfig
    from sglang_histospec.engine.engine import Engine
    from sglang_histospec.trace.format import TraceWriter

    prompts = task.prompts[: config.num_prompts] if config.num_prompts else task.prompts
    engine = Engine(
        EngineConfig(
            model_path=str(model_dir),
            device="cpu",
            speculative_algorithm=speculative_algorithm,
            max_running_requests=config.max_running_requests,
            num_draft_tokens=config.num_draft_tokens,
            draft_selection=config.draft_selection,
            seed=config.seed,
        )
    )
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError(f"{model_dir}: no tokenizer; pass a directory made by build_or_load_demo_model")
    prompt_ids = {p.prompt_id: tokenizer(p.text).input_ids for p in prompts}
    pairs = [(p.prompt_id, prompt_ids[p.prompt_id]) for p in prompts]
    writer = TraceWriter(trace_path) if trace_path is not None else None
    out: list[EpochStats] = []
    try:
        for epoch in range(config.epochs):
            requests = epoch_requests(
                pairs, config.group_size, config.temperature, config.max_new_tokens, config.seed, epoch
            )
            before = engine.stats()
            desc = f"{speculative_algorithm.lower()} epoch {epoch}"
            results, seconds = _run_requests(engine, requests, desc, progress)
            after = engine.stats()
            rewards = _score_and_push(engine, task, prompts, prompt_ids, results, epoch, config.group_size, writer)
            engine.drafter.end_step(epoch)
            out.append(_epoch_stats(epoch, speculative_algorithm, len(requests), rewards, before, after, seconds))
    finally:
        if writer is not None:
            writer.close()
    return out
