"""Offline environment, tiny data and GRPOConfig fields for TRL tests (the server subprocess is the product's
``sglang_histospec.demo.server_process.RolloutServerProcess``).

Example::

    with RolloutServerProcess(model_dir) as srv:
        args = HistoSpecGRPOConfig(output_dir=..., rollout_urls=[srv.url], **tiny_grpo_kwargs())
"""

from __future__ import annotations

# Environment of TRL tests: set by the ``trl_env`` fixture (tests/conftest.py), or passed to the subprocesses they
# start; never set at import (pytest imports every test module at collection, so it would leak into every test).
ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}


def tiny_dataset(n: int = 4, with_ids: bool = True, id_prefix: str = "q"):
    """``n`` short text prompts with a ``prompt_id`` column ``{id_prefix}0``, ... (none if ``with_ids`` is False).

    Tests sharing one server use distinct prefixes: the drafter keeps one visit per (prompt id, step) and refuses
    a second push for the same pair, as when two runs start from step 0 on one server."""
    from datasets import Dataset

    prompts = [f"what is {i}+{i}?" for i in range(n)]
    data = {"prompt": prompts}
    if with_ids:
        data["prompt_id"] = [f"{id_prefix}{i}" for i in range(n)]
    return Dataset.from_dict(data)


def length_reward(completions, **kwargs):
    """A reward that depends on the completion (so advantages are non-zero)."""
    return [len(c) / 10.0 for c in completions]


def tiny_grpo_kwargs(**overrides):
    """GRPOConfig fields for fast CPU runs (override any)."""
    kw = dict(
        use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4, num_generations=4,
        gradient_accumulation_steps=1, max_completion_length=8, max_steps=2, logging_steps=1,
        gradient_checkpointing=False, save_strategy="no", learning_rate=1e-2, seed=0, disable_tqdm=True,
    )  # fmt: skip
    kw.update(overrides)
    return kw
