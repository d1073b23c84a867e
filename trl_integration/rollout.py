"""``make_rollout_func``: the rollout servers behind TRL's official ``rollout_func(prompts, trainer)`` hook.

For users who keep the stock ``GRPOTrainer``: the returned function syncs weights, tokenizes as TRL does and
generates on the servers with prompt ids (what it does and what it does not push: :func:`make_rollout_func`;
README, "Use with TRL"). Example::

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=ds,
                          processing_class=tok, rollout_func=make_rollout_func(["http://127.0.0.1:30000"]))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from sglang_histospec.drafting.prompt_ids import PROMPT_ID_KEY, prompt_id_for
from trl_integration.generation import sampling_from_trainer
from trl_integration.servers import RolloutServers
from trl_integration.trl_internals import tokenize_prompts
from trl_integration.weight_sync import DiskWeightSync


def make_rollout_func(
    rollout_urls: Sequence[str] | str,
    *,
    prompt_id_fn: Callable[[Any], str | None] | None = None,
    weight_sync_dir: str | None = None,
    request_timeout: float = 600.0,
    admin_api_key: str | None = None,
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A ``rollout_func(prompts, trainer) -> dict`` generating on ``rollout_urls`` (module docstring: an example).

    ``weight_sync_dir`` defaults to ``<trainer.args.output_dir>/histospec-weights``; the servers must read it.

    For users who keep the stock ``GRPOTrainer``. The returned function, called by TRL on every rank with that rank's
    prompts (the G copies of each included):

    - syncs the weights itself (save + ``/update_weights_from_disk``) whenever ``trainer.state.global_step`` changed
      since its last sync, like TRL's own lazy sync (skipped when the trainer already syncs: ``HistoSpecGRPOTrainer``);
    - tokenizes the prompts the way TRL does (chat template for conversational prompts);
    - sends each with its prompt id (``prompt_id_fn(prompt)``; by default, or when it returns None, the servers' hash
      of the prompt tokens, ``drafting/prompt_ids.py``) and returns ``prompt_ids``, ``completion_ids``, ``logprobs``
      (per-token floats) and ``histospec_prompt_id`` (reaches reward functions as a keyword argument).

    History: the server records every response under its prompt id itself and files it under the step when the next
    weight update arrives, so history builds up without pushes. Rewards are not pushed on this path (use
    ``HistoSpecGRPOTrainer`` for reward-weighted history). TRL applies its importance-sampling correction only with
    ``use_vllm``, which the stock trainer leaves off, so the returned logprobs are informational there.
    """
    servers = RolloutServers(rollout_urls, request_timeout, admin_api_key or os.environ.get("HISTOSPEC_ADMIN_API_KEY"))
    state: dict[str, Any] = {"last_step": None, "sync": None}

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        accelerator = trainer.accelerator
        if not getattr(trainer, "use_vllm", False) and trainer.state.global_step != state["last_step"]:
            if state["sync"] is None:
                directory = weight_sync_dir or os.path.join(trainer.args.output_dir or ".", "histospec-weights")
                main = accelerator.is_main_process
                state["sync"] = DiskWeightSync(servers if main else None, directory, trainer.processing_class)
            state["sync"].sync(accelerator, trainer.model, trainer.state.global_step)
            state["last_step"] = trainer.state.global_step
        prompt_token_ids = tokenize_prompts(trainer, prompts)
        given = [prompt_id_fn(p) for p in prompts] if prompt_id_fn is not None else [None] * len(prompts)
        pids = [prompt_id_for({PROMPT_ID_KEY: pid}, t) for pid, t in zip(given, prompt_token_ids)]
        outs = servers.generate(
            [list(p) for p in prompt_token_ids],
            pids,
            sampling_from_trainer(trainer),
            return_logprob=True,
            fallback_route=accelerator.process_index,
        )
        return {
            "prompt_ids": [list(p) for p in prompt_token_ids],
            "completion_ids": [o.completion_ids for o in outs],
            "logprobs": [o.logprobs for o in outs],
            "histospec_prompt_id": pids,
        }

    rollout_func.servers = servers  # type: ignore[attr-defined]
    return rollout_func
