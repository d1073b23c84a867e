"""Every use of TRL's private API, in one place, checked against the pinned TRL by ``tests/trl/test_trl_internals.py``.

The rest of ``trl_integration`` uses public hooks (``rollout_func``, ``reward_funcs``, transformers'
``Trainer.training_step`` / ``prediction_step``). What TRL 1.16.0 offers no public way to do is here:

* ``adopt_generation_slot``: TRL syncs weights lazily and corrects for the sampler's logprobs only on its vLLM path,
  so our backend takes ``vllm_generation``'s place (TRL then calls ``sync_weights()`` and ``generate(...)``);
* ``RewardHook._calculate_rewards``: the one point where every reward function's output, gathered over ranks, is seen;
* ``log_metric`` (``_metrics``), ``tokenizer_of`` (``_tokenizer``), ``synced_step`` (``_last_loaded_step``),
  ``tokenize_prompts`` (``_tokenize_prompts``: TRL's chat template).

Example: ``check_pinned_trl()`` returns ``[]`` on TRL 1.16.0, else one line per private name that changed.
"""

from __future__ import annotations

import inspect
from typing import Any

PINNED_TRL_VERSION = "1.16.0"

PRIVATE_METHODS = {
    "trl.GRPOTrainer._calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "trl.GRPOTrainer._tokenize_prompts": ["self", "prompts"],
    "trl.GRPOTrainer._generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
    "trl.generation.vllm_generation.VLLMGeneration.generate": [
        "self",
        "prompts",
        "images",
        "num_generations",
        "profiler",
    ],
    "trl.generation.vllm_generation.VLLMGeneration.sync_weights": ["self"],
}
"""Parameter names of the private methods we override, call or stand in for, as in the pinned TRL."""

PRIVATE_USES = {
    "trl.GRPOTrainer._generate_single_turn": [
        "self.state.global_step != self._last_loaded_step",
        "self.vllm_generation.sync_weights()",
        "self.vllm_generation.generate(",
    ],
    "trl.GRPOTrainer.log": ["self._metrics[mode]"],
    "trl.GRPOTrainer._prepare_inputs": ["self._generate_and_score_completions(generation_batch)"],
    "trl.GRPOTrainer._generate_and_score_completions": ["self._calculate_rewards("],
}
"""Source fragments of the pinned TRL showing it still drives the attributes and methods we rely on."""


class RewardHook:
    """Mixin before ``GRPOTrainer``: hands TRL's gathered rewards ``[N_global, n_reward_funcs]`` to
    ``self.on_rewards`` each time TRL scores a generation.

    TRL's ``_calculate_rewards`` is the one point where every reward function's output (reward models included),
    gathered over ranks, is seen.
    """

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: ANN001 - TRL's names
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # type: ignore[misc]
        self.on_rewards(rewards)  # type: ignore[attr-defined]
        return rewards


def adopt_generation_slot(trainer: Any, backend: Any) -> None:
    """Make TRL generate through ``backend`` (``sync_weights()``, ``generate(prompts, images, num_generations,
    profiler)``) as on its vLLM server path: lazy weight sync keyed on ``global_step``, importance-sampling
    correction with the backend's logprobs; weights are synced before the first generation."""
    trainer.use_vllm = True
    trainer.vllm_mode = "server"
    trainer.vllm_generation = backend
    trainer._last_loaded_step = -1


def synced_step(trainer: Any) -> int:
    """The ``global_step`` of the weights TRL last synced to the backend (-1 before the first sync)."""
    return int(trainer._last_loaded_step)


def log_metric(trainer: Any, mode: str, name: str, value: float) -> None:
    """Add ``value`` to the metrics TRL averages into the next log line of ``mode`` ("train" or "eval")."""
    trainer._metrics[mode][name].append(value)


def tokenizer_of(trainer: Any) -> Any:
    """The tokenizer of the trainer's processing class (a processor's tokenizer, or the tokenizer itself)."""
    return trainer._tokenizer


def tokenize_prompts(trainer: Any, prompts: list[Any]) -> list[list[int]]:
    """Token ids of ``prompts`` exactly as TRL tokenizes them for generation (chat template when conversational)."""
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    return prompt_ids


def _resolve(dotted: str) -> Any:
    import importlib

    module_name, _, rest = dotted.partition(".")
    obj: Any = importlib.import_module(module_name)
    for part in rest.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def check_pinned_trl() -> list[str]:
    """One line per private name of ``PRIVATE_METHODS`` / ``PRIVATE_USES`` that the installed TRL lacks or changed,
    plus one when its version is not ``PINNED_TRL_VERSION``; empty when everything matches."""
    import trl

    problems = []
    if trl.__version__ != PINNED_TRL_VERSION:
        problems.append(f"trl {trl.__version__} is installed; trl_integration is tested on {PINNED_TRL_VERSION}")
    for name, expected in PRIVATE_METHODS.items():
        try:
            found = list(inspect.signature(_resolve(name)).parameters)
        except (AttributeError, ImportError) as exc:
            problems.append(f"{name}: missing ({exc})")
            continue
        if found != expected:
            problems.append(f"{name}: parameters {found}, expected {expected}")
    for name, fragments in PRIVATE_USES.items():
        source = inspect.getsource(_resolve(name))
        problems += [f"{name}: no longer contains {f!r}" for f in fragments if f not in source]
    return problems
