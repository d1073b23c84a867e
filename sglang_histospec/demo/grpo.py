"""GRPO on the demo task with ``HistoSpecGRPOTrainer`` against a rollout server subprocess (torch backend).

:func:`run_grpo` trains for a number of epochs and returns per-epoch rewards and drafting figures, writing every
response with its reward to a trace (docs/replay.md section 1); ``GRPORunConfig.side_by_side`` also times a
plain-decoding replay of every rollout. Measured runs: docs/results.md, "Demo".

Example::

    stats = run_grpo(model_dir, ArithTask(), GRPORunConfig(epochs=3), "HISTOSPEC", work_dir, trace_path="t.jsonl.gz")
    [s.mean_reward for s in stats], stats[-1].tau
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sglang_histospec.demo.rollouts import EpochStats
from sglang_histospec.engine.types import DRAFT_SELECTIONS


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
    train_layers: int | None = None
    """Train only the top ``train_layers`` decoder layers and the final norm (None: the full model)."""
    side_by_side: bool = False
    """With ``HISTOSPEC``: replay every rollout request on a second, plain-decoding (``NONE``) server that holds the
    same weights, right after the HistoSpec server answered, and time both (``EpochStats.plain_seconds``). Every
    weight sync goes to both servers; both start from the same seed and see the same requests in the same order, so
    each request draws the same random stream and the replay emits the same tokens: the two timings measure the same
    work, and ``identical`` counts the responses that matched."""
    max_running_requests: int | None = None
    """Requests each rollout server decodes together (``histospec serve --max-running-requests``); None = the
    server's default. Fewer running requests make a step cheaper and closer to memory-bound, where verifying draft
    rows costs little next to the step."""
    draft_selection: str = "adaptive"
    """The HistoSpec server's ``--draft-selection`` (``EngineConfig.draft_selection``): "adaptive" or "always"."""
    importance_sampling: bool = True
    """TRL's ``vllm_importance_sampling_correction`` (an extra forward over each batch; the rollouts are on-policy
    here, so the ratio it corrects is 1 up to rounding)."""

    def __post_init__(self) -> None:
        for name in ("epochs", "num_prompts", "group_size", "prompts_per_step", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"max_running_requests={self.max_running_requests}: use >= 1, or None for the default")
        if self.draft_selection not in DRAFT_SELECTIONS:
            raise ValueError(f"draft_selection={self.draft_selection!r}: use one of {', '.join(DRAFT_SELECTIONS)}")
        if self.train_layers is not None and self.train_layers < 1:
            raise ValueError(f"train_layers={self.train_layers}: use >= 1, or None for the full model")
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


class GRPOTask(Protocol):
    """What a demo run trains on: data-set rows ``{"prompt", "prompt_id", ...}`` and a TRL reward function."""

    def rows(self) -> list[dict[str, object]]: ...

    def reward_func(self, prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]: ...


def run_grpo(
    model_dir: str | os.PathLike,
    task: GRPOTask,
    config: GRPORunConfig,
    speculative_algorithm: str,
    work_dir: str | os.PathLike,
    trace_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> list[EpochStats]:
    """Train with GRPO for ``config.epochs`` epochs against a fresh ``speculative_algorithm`` server.

    One server (``HISTOSPEC`` or ``NONE``) and one trainer starting from the pretrained demo model. Every epoch
    visits each prompt of the fixed set once (``prompts_per_step`` prompts x ``group_size`` samples per step). Per
    epoch the run records the mean reward, the tokens, verify steps, drafted and accepted tokens the server
    reported, and the wall time of the rollouts (the trainer's calls to the server's ``/generate``), and writes
    every response with its reward to ``trace_path`` (the trace format of docs/replay.md section 1).

    ``work_dir`` receives the trainer's output (weight-sync checkpoints) and the server logs. Returns one
    :class:`~sglang_histospec.demo.rollouts.EpochStats` per epoch (``seconds`` = rollout wall time; with
    ``config.side_by_side`` also the plain replay's ``plain_seconds``, ``plain_reward`` and ``identical``).
    """
    from transformers import AutoTokenizer

    from sglang_histospec.demo.server_process import RolloutServerProcess

    if config.side_by_side and speculative_algorithm != "HISTOSPEC":
        raise ValueError(f"side_by_side=True replays HISTOSPEC rollouts; got {speculative_algorithm!r}")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = task.rows()
    if len(rows) < config.num_prompts:
        raise ValueError(f"num_prompts={config.num_prompts} but the task has {len(rows)} prompts")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    run = _Run(config, task, tokenizer, trace_path, progress, speculative_algorithm)
    with ExitStack() as stack:
        extra = ["--draft-selection", config.draft_selection]
        if config.max_running_requests is not None:
            extra += ["--max-running-requests", str(config.max_running_requests)]
        server = stack.enter_context(
            RolloutServerProcess(
                model_dir, speculative_algorithm, log_path=work / "server.log", seed=config.seed, extra_args=extra
            )
        )
        if config.side_by_side:
            plain = RolloutServerProcess(
                model_dir, "NONE", log_path=work / "server-plain.log", seed=config.seed, extra_args=extra
            )
            run.plain = stack.enter_context(plain)
        stack.callback(run.close)
        trainer = _trainer(model_dir, rows[: config.num_prompts], run, server.url, work / "trainer")
        run.instrument(trainer)
        with warnings.catch_warnings():  # TRL 1.16 still calls transformers' deprecated checkpointing names
            warnings.filterwarnings("ignore", r".*gradient_checkpointing.* is deprecated", FutureWarning)
            trainer.train()
        _save_server_stats(server.url, work / "server-stats.json")
    return _epochs(run.per_step, config, speculative_algorithm)


def _save_server_stats(url: str, path: Path) -> None:
    """The server's ``/histospec/stats`` at the end of the run (the engine's counters, its step model and governor:
    how many steps decoded plainly and why), written to ``path`` as JSON."""
    import json

    from sglang_histospec.server.client import HistoSpecClient

    with HistoSpecClient(url) as client:
        path.write_text(json.dumps(client.stats(), indent=1, default=str))


def _trainer(model_dir: str | os.PathLike, rows: list[dict], run: _Run, url: str, output_dir: Path) -> Any:
    """A ``HistoSpecGRPOTrainer`` on ``rows`` against the server at ``url`` (our bar replaces TRL's printer)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback
    from transformers.utils import logging as hf_logging

    from sglang_histospec.trace.record import trainable_params
    from trl_integration import HistoSpecGRPOConfig, HistoSpecGRPOTrainer

    cfg = run.config
    hf_logging.disable_progress_bar()  # weight loading and every sync's save would draw bars between ours
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if cfg.train_layers is not None:
        trainable_params(model, cfg.train_layers)  # the Trainer's optimizer takes the parameters left trainable
    args = HistoSpecGRPOConfig(
        output_dir=str(output_dir),
        rollout_urls=[url],
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size,
        num_generations=cfg.group_size,
        gradient_accumulation_steps=1,
        max_completion_length=cfg.max_new_tokens,
        max_steps=cfg.epochs * cfg.steps_per_epoch,
        temperature=1.0,
        learning_rate=cfg.learning_rate,
        logging_steps=1,
        save_strategy="no",
        seed=cfg.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        vllm_importance_sampling_correction=cfg.importance_sampling,
        activation_checkpointing=False,  # TRL's GRPO default is on: a second forward per step, for memory we have
    )
    trainer = HistoSpecGRPOTrainer(
        model=model,
        reward_funcs=run.reward_fn,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=run.tokenizer,
        callbacks=[run.callback()],
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


class _Run:
    """Per-step accounting of one run: rewards, trace lines, rollout timings (and the plain replay), progress."""

    def __init__(self, config: GRPORunConfig, task: GRPOTask, tokenizer: Any, trace_path: Any, progress: bool,
                 mode: str) -> None:  # fmt: skip
        from tqdm.auto import tqdm

        from sglang_histospec.trace.format import TraceWriter

        self.config, self.task, self.tokenizer = config, task, tokenizer
        self.per_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.samples_seen: dict[tuple[int, str], int] = defaultdict(int)
        self.writer = TraceWriter(trace_path) if trace_path is not None else None
        self.plain: Any = None  # the NONE server of a side-by-side run
        self.phases = 3 if config.side_by_side else 2
        total = config.epochs * config.steps_per_epoch * self.phases
        self.bar = tqdm(total=total, desc=f"GRPO ({mode.lower()})", unit="phase", disable=not progress)

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()

    def phase_done(self, step: int, next_phase: str) -> None:
        self.bar.set_description(f"GRPO step {step + 1}/{self.bar.total // self.phases}: {next_phase}", refresh=False)
        self.bar.update(1)

    def reward_fn(self, prompts, completions, completion_ids, prompt_id, trainer_state, **_):  # noqa: ANN001
        """TRL's reward call: the task's rewards, recorded per step and written to the trace."""
        from sglang_histospec.trace.format import TraceRecord

        step = int(trainer_state.global_step)
        rewards = self.task.reward_func(prompts, completions, prompt_id=prompt_id)
        row = self.per_step[step]
        row["reward_sum"] += sum(rewards)
        row["responses"] += len(rewards)
        if self.writer is not None:
            for text, ids, pid, r in zip(prompts, completion_ids, prompt_id, rewards):
                k = self.samples_seen[(step, pid)]
                self.samples_seen[(step, pid)] += 1
                rec = TraceRecord(step=step, prompt_id=pid, sample=k, prompt=self.tokenizer(text).input_ids,
                                  response=[int(t) for t in ids], epoch=step // self.config.steps_per_epoch,
                                  reward=r)  # fmt: skip
                self.writer.write(rec)
        return rewards

    def callback(self) -> Any:
        from transformers import TrainerCallback

        run = self

        class _Progress(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - TRL's callback signature
                row = run.per_step.get(state.global_step - 1)
                if row and row["responses"]:
                    run.bar.set_postfix(reward=f"{row['reward_sum'] / row['responses']:.2f}", refresh=False)
                last = state.global_step >= run.bar.total // run.phases
                run.phase_done(state.global_step - last, "done" if last else "rollout (HistoSpec)")

        return _Progress()

    def instrument(self, trainer: Any) -> None:
        """Time the trainer's rollouts; in a side-by-side run, replay each on the plain server with the same
        weights (every weight sync goes to both servers)."""
        from trl_integration.servers import RolloutServers
        from trl_integration.weight_sync import WEIGHTS_SUBDIR

        backend = trainer.histospec
        plain_generate, plain_sync = backend.generate, backend.sync_weights
        replay = RolloutServers([self.plain.url]) if self.plain is not None else None

        def timed_generate(prompts: Any, *a: Any, **kw: Any) -> Any:  # the rollout wall time TRL waits for, per step
            step = int(trainer.state.global_step)
            with ThreadPoolExecutor(max_workers=1) as pool:
                replayed = None
                if replay is not None:  # the same requests on the plain server at the same time: the same load
                    ids, pids = backend.request_args(prompts)
                    replayed = pool.submit(_timed, replay.generate, ids, pids, backend.sampling, return_logprob=True)
                start = time.perf_counter()
                out = plain_generate(prompts, *a, **kw)
                self._count(step, time.perf_counter() - start, backend.records[-1].completions)
                if replayed is not None:
                    self.phase_done(step, "rollout (plain replay)")
                    self._count_replay(step, backend.records[-1], *replayed.result())
            self.phase_done(step, "training")
            return out

        def synced_weights() -> None:
            plain_sync()
            if self.plain is not None:
                path = os.path.join(backend.weight_sync.directory, WEIGHTS_SUBDIR)
                self.plain.client.update_weights_from_disk(path, weight_version=str(trainer.state.global_step))

        backend.generate, backend.sync_weights = timed_generate, synced_weights
        self._warm_servers(trainer)

    def _warm_servers(self, trainer: Any) -> None:
        """One short untimed request per server, so that no timed rollout pays a fresh process's first forwards.
        Both servers see it (their seed streams stay aligned); it has no prompt id, so no history records it."""
        ids = self.tokenizer(str(self.task.rows()[0]["prompt"]), add_special_tokens=False).input_ids
        for client in [c for c in [*trainer.servers.clients, getattr(self.plain, "client", None)] if c is not None]:
            client.generate([ids], max_new_tokens=4)

    def _count(self, step: int, seconds: float, completions: list) -> None:
        row = self.per_step[step]
        row["seconds"] += seconds
        for c in completions:
            row["tokens"] += len(c.completion_ids)
            row["verify_steps"] += c.verify_steps
            row["drafted"] += c.drafted
            row["accepted"] += c.accepted
            row["nll"] -= sum(lp for lp in c.logprobs or [] if math.isfinite(lp))

    def _count_replay(self, step: int, record: Any, outs: list, seconds: float) -> None:
        """The plain server's answers to the same requests (seeded alike: the same tokens): time, tokens, rewards."""
        row = self.per_step[step]
        row["plain_seconds"] += seconds
        row["plain_tokens"] += sum(len(o.completion_ids) for o in outs)
        row["identical"] += sum(o.completion_ids == c.completion_ids for o, c in zip(outs, record.completions))
        prompts = self.tokenizer.batch_decode(record.prompt_token_ids, skip_special_tokens=False)
        texts = self.tokenizer.batch_decode([o.completion_ids for o in outs], skip_special_tokens=True)
        pids = [p or "" for p in record.prompt_ids]
        row["plain_reward_sum"] += sum(self.task.reward_func(prompts, texts, prompt_id=pids))


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), its wall seconds)``. Example: ``_timed(abs, -4)[0]`` is ``4``."""
    start = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - start


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
                nll=total("nll"),
                **(_replayed(total, responses) if config.side_by_side else {}),
            )
        )
    return out


def _replayed(total: Any, responses: int) -> dict[str, Any]:
    return {
        "plain_seconds": total("plain_seconds"),
        "plain_tokens": int(total("plain_tokens")),
        "plain_reward": total("plain_reward_sum") / responses if responses else 0.0,
        "identical": int(total("identical")),
    }
