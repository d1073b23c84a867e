"""GRPO on the demo task with ``HistoSpecGRPOTrainer`` against a rollout server subprocess (torch backend).

One run = one server (``HISTOSPEC`` or ``NONE``) and one trainer starting from the pretrained demo model. Every
epoch visits each prompt of the fixed set once (``prompts_per_step`` prompts x ``group_size`` samples per step).
Per epoch the run records the mean reward, the tokens, verify steps, drafted and accepted tokens the server
reported, and the wall time of the rollouts (the trainer's calls to the server's ``/generate``), and writes every
response with its reward to a trace (design.md section 3).

Example::

    stats = run_grpo(model_dir, ArithTask(), GRPORunConfig(epochs=3), "HISTOSPEC", work_dir, trace_path="t.jsonl.gz")
    [s.mean_reward for s in stats], stats[-1].tau
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sglang_histospec.demo.rollouts import EpochStats
from sglang_histospec.demo.task import ArithTask


@dataclass(frozen=True)
class GRPORunConfig:
    """Shape of a demo GRPO run (TRL settings not listed keep TRL's defaults, e.g. ``beta=0``)."""

    epochs: int = 4
    """Passes over the prompt set."""
    num_prompts: int = 32
    """Use the first ``num_prompts`` prompts of the task."""
    group_size: int = 8
    """Samples per prompt (``num_generations``)."""
    prompts_per_step: int = 8
    """Distinct prompts per optimizer step (``per_device_train_batch_size = prompts_per_step * group_size``)."""
    max_new_tokens: int = 48
    """``max_completion_length``."""
    learning_rate: float = 1e-3
    """AdamW learning rate of the policy."""
    seed: int = 0
    """Trainer seed (data order, initial weights are the pretrained ones) and the server's sampling seed."""

    def __post_init__(self) -> None:
        for name in ("epochs", "num_prompts", "group_size", "prompts_per_step", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size}: GRPO needs >= 2 samples per prompt")
        if self.num_prompts % self.prompts_per_step:
            raise ValueError(
                f"num_prompts={self.num_prompts} is not a multiple of prompts_per_step={self.prompts_per_step}; "
                "pick values so every epoch has whole steps"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.num_prompts // self.prompts_per_step


def trainer_available() -> str | None:
    """None when TRL and ``trl_integration`` import, else the reason (shown by ``histospec demo``)."""
    try:
        import trl  # noqa: F401

        import trl_integration.trainer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken optional install
        return f"{type(exc).__name__}: {exc}"
    return None


def run_grpo(
    model_dir: str | os.PathLike,
    task: ArithTask,
    config: GRPORunConfig,
    speculative_algorithm: str,
    work_dir: str | os.PathLike,
    trace_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> list[EpochStats]:
    """Train with GRPO for ``config.epochs`` epochs against a fresh ``speculative_algorithm`` server.

    ``work_dir`` receives the trainer's output (weight-sync checkpoints) and the server log. Returns one
    :class:`~sglang_histospec.demo.rollouts.EpochStats` per epoch (``seconds`` = rollout wall time).
    """
    import torch
    from datasets import Dataset
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    from sglang_histospec.demo.server_process import RolloutServerProcess
    from sglang_histospec.trace.format import TraceRecord, TraceWriter
    from trl_integration import HistoSpecGRPOConfig, HistoSpecGRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    prompts = task.prompts[: config.num_prompts]
    if len(prompts) < config.num_prompts:
        raise ValueError(f"num_prompts={config.num_prompts} but the task has {len(task.prompts)} prompts")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    dataset = Dataset.from_list([task.rows()[i] for i in range(config.num_prompts)])
    per_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    samples_seen: dict[tuple[int, str], int] = defaultdict(int)
    writer = TraceWriter(trace_path) if trace_path is not None else None

    def reward_fn(prompts, completions, completion_ids, prompt_id, trainer_state, **_):  # noqa: ANN001 - TRL's call
        step = int(trainer_state.global_step)
        rewards = task.reward_func(prompts, completions)
        row = per_step[step]
        row["reward_sum"] += sum(rewards)
        row["responses"] += len(rewards)
        if writer is not None:
            for text, ids, pid, r in zip(prompts, completion_ids, prompt_id, rewards):
                k = samples_seen[(step, pid)]
                samples_seen[(step, pid)] += 1
                rec = TraceRecord(step=step, prompt_id=pid, sample=k, prompt=tokenizer(text).input_ids,
                                  response=[int(t) for t in ids], epoch=step // config.steps_per_epoch, reward=r)  # fmt: skip
                writer.write(rec)
        return rewards

    reward_fn.__name__ = "arith_reward"
    bar = tqdm(
        total=config.epochs * config.steps_per_epoch,
        desc=f"GRPO ({speculative_algorithm.lower()})",
        unit="step",
        disable=not progress,
    )

    class _Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - TRL's callback signature
            row = per_step.get(state.global_step - 1)
            if row and row["responses"]:
                bar.set_postfix(reward=f"{row['reward_sum'] / row['responses']:.2f}", refresh=False)
            bar.update(1)

    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with RolloutServerProcess(
        model_dir, speculative_algorithm, log_path=work / "server.log", seed=config.seed
    ) as server:
        args = HistoSpecGRPOConfig(
            output_dir=str(work / "trainer"),
            rollout_urls=[server.url],
            use_cpu=True,
            bf16=False,
            report_to="none",
            per_device_train_batch_size=config.prompts_per_step * config.group_size,
            num_generations=config.group_size,
            gradient_accumulation_steps=1,
            max_completion_length=config.max_new_tokens,
            max_steps=config.epochs * config.steps_per_epoch,
            temperature=1.0,
            learning_rate=config.learning_rate,
            logging_steps=1,
            save_strategy="no",
            seed=config.seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = HistoSpecGRPOTrainer(
            model=model,
            reward_funcs=reward_fn,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[_Progress()],
        )
        trainer.remove_callback(PrinterCallback)  # our bar replaces the per-step log dicts on stdout
        backend = trainer.histospec
        plain_generate = backend.generate

        def timed_generate(*a, **kw):  # the rollout wall time TRL waits for, per step
            start = time.perf_counter()
            out = plain_generate(*a, **kw)
            row = per_step[int(trainer.state.global_step)]
            row["seconds"] += time.perf_counter() - start
            for c in backend.records[-1].completions:
                row["tokens"] += len(c.completion_ids)
                row["verify_steps"] += c.verify_steps
                row["drafted"] += c.drafted
                row["accepted"] += c.accepted
            return out

        backend.generate = timed_generate
        try:
            trainer.train()
        finally:
            bar.close()
            if writer is not None:
                writer.close()
    return _epochs(per_step, config, speculative_algorithm)


def _epochs(per_step: dict[int, dict[str, float]], config: GRPORunConfig, mode: str) -> list[EpochStats]:
    out = []
    for epoch in range(config.epochs):
        rows = [
            per_step.get(s, {}) for s in range(epoch * config.steps_per_epoch, (epoch + 1) * config.steps_per_epoch)
        ]

        def total(key: str, rows=rows) -> float:
            return sum(r.get(key, 0.0) for r in rows)

        responses = int(total("responses"))
        out.append(
            EpochStats(
                epoch=epoch,
                mode=mode,
                responses=responses,
                mean_reward=total("reward_sum") / responses if responses else 0.0,
                tokens=int(total("tokens")),
                verify_steps=int(total("verify_steps")),
                drafted=int(total("drafted")),
                accepted=int(total("accepted")),
                seconds=total("seconds"),
            )
        )
    return out
