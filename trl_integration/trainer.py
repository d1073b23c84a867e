"""``HistoSpecGRPOTrainer``: TRL's ``GRPOTrainer`` whose rollouts run on HistoSpec rollout servers.

What changes against ``GRPOTrainer`` (generation slot, prompt ids, history pushes, metrics) and the limits: the
class docstring; README, "Use with TRL"; docs/architecture.md, "Life of a training step". Example::

    args = HistoSpecGRPOConfig(output_dir="out", rollout_urls=["http://127.0.0.1:30000"])
    trainer = HistoSpecGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                                   processing_class=tokenizer)
    trainer.train()
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from sglang_histospec.drafting.types import tau
from trl_integration.config import HistoSpecGRPOConfig
from trl_integration.generation import GenerationRecord, HistoSpecGeneration, sampling_from_trainer
from trl_integration.prompt_ids import resolve_prompt_ids
from trl_integration.servers import RolloutServers
from trl_integration.trace import RolloutTrace
from trl_integration.trl_internals import RewardHook, adopt_generation_slot, log_metric, synced_step, tokenizer_of
from trl_integration.weight_sync import DiskWeightSync, DistributedSyncConfig, DistributedWeightSync


class HistoSpecGRPOTrainer(RewardHook, GRPOTrainer):
    """Drop-in ``GRPOTrainer`` (same constructor) that needs a ``HistoSpecGRPOConfig``.

    Attributes added: ``servers`` (``RolloutServers``), ``histospec`` (the generation backend; ``histospec.records``,
    ``histospec.synced_steps``), ``history_pushes`` (list of ``(step, responses pushed)`` on the main process),
    ``recent_generations`` (this rank's last ``RECENT_GENERATIONS`` generation records, oldest first).

    What changes against ``GRPOTrainer`` (everything else, batching, gradient accumulation, ``num_iterations`` reuse,
    the loss, is TRL's own code), through transformers' ``training_step`` / ``prediction_step`` (prompt ids before the
    step's generation, metrics and history push after it) and, where TRL has no public hook, ``trl_internals.py``:

    - generation: ``HistoSpecGeneration`` takes TRL's ``vllm_generation`` slot, so TRL itself decides when to sync
      weights (before a generation, when ``global_step`` changed) and applies its importance-sampling correction with
      the servers' per-token logprobs (``vllm_importance_sampling_*`` settings apply unchanged);
    - prompt ids: each row's ``prompt_id_column`` (or, without one, the servers' hash of its prompt tokens,
      ``drafting/prompt_ids.py``) goes with its requests;
    - history: after the rewards of a generation are known, its responses and rewards are gathered across ranks and
      pushed per prompt id to every server (``/histospec/history``, step = the weights' global step);
    - trace: with ``trace_path`` the same rollouts, with rewards and logprobs, are appended to a trace file, one
      append per generation (``trl_integration/trace.py``; what a crash leaves: ``trace/append.py``);
    - metrics: ``histospec/tau``, ``histospec/accept_rate``, ``histospec/drafted_tokens``,
      ``histospec/accepted_tokens`` (this generation, all ranks) and ``histospec/history_tokens``,
      ``histospec/history_prompts`` (server, main process).

    Limits: text prompts only (no images); with ``tools``, TRL's tool loop generates again for the samples that called
    a tool, and those follow-up requests go without the row's prompt id (the servers key them by their own tokens, and
    they are not pushed); PEFT models are refused at the first weight sync (merge the adapters first).
    """

    RECENT_GENERATIONS = 64

    def __init__(self, model: Any, reward_funcs: Any = None, args: HistoSpecGRPOConfig | None = None, **kwargs: Any):
        if not isinstance(args, HistoSpecGRPOConfig):
            raise ValueError(
                f"args is a {type(args).__name__}; HistoSpecGRPOTrainer needs a HistoSpecGRPOConfig "
                "(GRPOConfig fields plus rollout_urls=[...])"
            )
        super().__init__(model, reward_funcs, args, **kwargs)
        self.servers = RolloutServers(args.rollout_urls, args.request_timeout, args.rollout_admin_api_key)
        if args.check_tokenizer:
            vocab = getattr(self.accelerator.unwrap_model(self.model).config, "vocab_size", None)
            self.servers.check(tokenizer_of(self), vocab, ready_timeout=args.server_ready_timeout)
        else:
            self.servers.wait_until_ready(args.server_ready_timeout)
        main = self.accelerator.is_main_process
        if args.weight_sync == "disk":
            weight_sync: Any = DiskWeightSync(self.servers if main else None, args.weight_sync_dir, tokenizer_of(self))
        else:
            weight_sync = DistributedWeightSync(
                self.servers if main else None,
                DistributedSyncConfig(
                    master_address=args.weight_sync_master_address,
                    master_port=args.weight_sync_master_port,
                    backend=args.weight_sync_backend,
                ),
            )
        self._histospec_row_ids: list[str | None] | None = None
        self._histospec_rewards: torch.Tensor | None = None
        self.history_pushes: list[tuple[int, int]] = []
        self.recent_generations: deque[GenerationRecord] = deque(maxlen=self.RECENT_GENERATIONS)
        self.histospec = HistoSpecGeneration(
            self.servers,
            weight_sync,
            self.accelerator,
            model_fn=lambda: self.model,
            step_fn=lambda: self.state.global_step,
            sampling=sampling_from_trainer(self),
            prompt_ids_fn=lambda: self._histospec_row_ids,
        )
        adopt_generation_slot(self, self.histospec)
        self._trace = RolloutTrace(args.trace_path) if args.trace_path and main else None

    # ---- transformers' public override points -------------------------------------------------------------
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        self._begin_batch(inputs)
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._finish_generation()
        return loss

    def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool, ignore_keys: Any = None) -> Any:
        self._begin_batch(inputs)
        output = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        self._finish_generation()
        return output

    def on_rewards(self, rewards: torch.Tensor) -> None:
        """TRL's rewards of this step's generation (``trl_internals.RewardHook``), for the history push."""
        self._histospec_rewards = rewards  # [N_global, n_reward_funcs], gathered over ranks by TRL

    def _begin_batch(self, inputs: list[dict[str, Any]]) -> None:
        """Before TRL's step: the rows' prompt ids, for the generation the step may run (TRL generates from
        exactly these rows)."""
        args: HistoSpecGRPOConfig = self.args  # type: ignore[assignment]
        self._histospec_row_ids = resolve_prompt_ids(inputs, args.prompt_id_column, args.hash_prompt_ids)
        self._histospec_rewards = None
        self.histospec.records = []

    def _finish_generation(self) -> None:
        """After TRL's step: the metrics of the generation it ran, if any, and (training) the history push."""
        args: HistoSpecGRPOConfig = self.args  # type: ignore[assignment]
        mode = "train" if self.model.training else "eval"
        records, self.histospec.records = self.histospec.records, []
        self.recent_generations.extend(records)
        if records:  # no generation this step (buffered inputs), or a rollout_func of the user's generated instead
            self._log_speculation(records, mode)
            if mode == "train" and self._histospec_rewards is not None and (args.push_history or args.trace_path):
                self._record_generation(records[0])

    # ---- history, trace and metrics ----------------------------------------------------------------------
    def _record_generation(self, record: GenerationRecord) -> None:
        """Gather (prompt id, prompt, response, logprobs) over ranks; the main process pushes them with their
        rewards (``push_history``) and appends them to the trace (``trace_path``)."""
        assert self._histospec_rewards is not None
        local = [
            (pid, prompt, c.completion_ids, c.logprobs)
            for pid, prompt, c in zip(record.prompt_ids, record.prompt_token_ids, record.completions)
        ]
        gathered = gather_object(local)
        weights = self.reward_weights.to(self._histospec_rewards.device)
        per_sample = (self._histospec_rewards * weights.unsqueeze(0)).nansum(dim=1).tolist()
        if not self.accelerator.is_main_process:
            return
        if len(per_sample) != len(gathered):  # tool loops or uneven batches: push without rewards
            per_sample = [math.nan] * len(gathered)
        step = max(synced_step(self), 0)
        if self._trace is not None:
            self._trace.append(step, int(self.state.epoch or 0), gathered, per_sample)
        if self.args.push_history:
            self._push_history(step, [g[:3] for g in gathered], per_sample)

    def _push_history(self, step: int, gathered: list[tuple[Any, ...]], per_sample: list[float]) -> None:
        """Push (prompt id, prompt, response) of every sample with its reward to every server (main process)."""
        entries: dict[str, dict[str, Any]] = {}
        for (pid, prompt, response), reward in zip(gathered, per_sample):
            if pid is None or not response:
                continue
            entry = entries.setdefault(
                pid, {"prompt_id": pid, "responses": [], "rewards": [], "prompt_tokens": prompt}
            )
            entry["responses"].append(list(response))
            entry["rewards"].append(float(reward))
        for entry in entries.values():
            if any(not math.isfinite(r) for r in entry["rewards"]):
                entry["rewards"] = None
        pushed = self.servers.push_history(step, list(entries.values()))
        self.history_pushes.append((step, pushed))
        totals: dict[str, float] = defaultdict(float)
        for stats in self.servers.stats():
            history = stats.get("history", {})
            totals["history_tokens"] += float(history.get("history_tokens", 0))
            totals["history_prompts"] += float(history.get("prompts", 0))
        for key, value in totals.items():
            log_metric(self, "train", f"histospec/{key}", value / len(self.servers.urls))

    def _log_speculation(self, records: list[GenerationRecord], mode: str) -> None:
        """tau and acceptance of this generation over all ranks (a collective: every rank calls it)."""
        local = torch.zeros(4, dtype=torch.float64)
        for record in records:
            for c in record.completions:
                local += torch.tensor(
                    [len(c.completion_ids), c.verify_steps, c.drafted, c.accepted], dtype=torch.float64
                )
        total = self.accelerator.gather(local.to(self.accelerator.device)).view(-1, 4).sum(dim=0).tolist()
        tokens, verify, drafted, accepted = total
        log_metric(self, mode, "histospec/tau", tau(tokens, verify))
        log_metric(self, mode, "histospec/accept_rate", accepted / drafted if drafted else 0.0)
        log_metric(self, mode, "histospec/drafted_tokens", drafted)
        log_metric(self, mode, "histospec/accepted_tokens", accepted)
