"""The demo on a real chat LLM: a chat task family as a GRPO task, and a cached supervised warm-up of the policy.

``histospec demo`` (default ``--model smollm2-135m-instruct``) prepares the model (``histospec model prepare``),
warms it up once on reference solutions of problems outside the prompt set (``trace.record.warmup``, cached like the toy
model's pretraining), then runs one GRPO run with ``HistoSpecGRPOTrainer`` whose every rollout is replayed on a
plain-decoding server with the same weights (``GRPORunConfig.side_by_side``).

Example::

    policy = warmed_policy(resolve_model("smollm2-135m-instruct"), WARMUP)      # cached after the first call
    task = ChatTask(make_family("arith", 8), AutoTokenizer.from_pretrained(policy))
    stats = run_grpo(policy, task, demo_run_config(quick=True), "HISTOSPEC", "work", "trace.jsonl.gz")
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from sglang_histospec.demo.grpo import GRPORunConfig
from sglang_histospec.models import cached_build, default_cache_dir
from sglang_histospec.tasks.chat import HELD_OUT, ChatFamily, make_family
from sglang_histospec.trace.record import RecordConfig, chat_ids

WARMUP_FORMAT = 1
"""Bump when the warm-up recipe or the saved layout changes, so stale cached policies are not reused."""
WARMUP_META = "histospec-warmup.json"  # written last: a directory without it is an interrupted warm-up

WARMUP = RecordConfig(family="arith", num_prompts=16, warmup_examples=64, warmup_epochs=3, train_layers=8)
"""The demo's warm-up: 64 reference solutions (``record.py`` records with 128), 3 passes, lr 2e-4, top 8 layers; only
the ``WARMUP_FIELDS`` are used."""
WARMUP_FIELDS = ("family", "num_prompts", "train_layers", "warmup_examples", "warmup_epochs", "warmup_lr",
                 "micro_batch", "seed")  # fmt: skip


def demo_run_config(quick: bool = False, epochs: int | None = None, seed: int = 0) -> GRPORunConfig:
    """The GRPO run of the LLM demo: 4 epochs (``quick``: 2) of one step, 4 prompts x G = 4 samples each, up to 128
    new tokens (the family's solutions take about 90), the top 8 layers trained, 4 requests decoded together.

    Why 4: on a CPU a step of 16 requests is compute-bound (one draft row costs about half a request's row, so
    only nodes that are almost sure pay); at 4 a step is closer to the memory-bound regime a GPU is in at far
    larger batches (docs/results.md, "Engine")."""
    return GRPORunConfig(
        epochs=epochs or (2 if quick else 4),
        num_prompts=4,
        group_size=4,
        prompts_per_step=4,
        max_new_tokens=128,
        learning_rate=2e-5,
        seed=seed,
        train_layers=WARMUP.train_layers,
        side_by_side=True,
        max_running_requests=4,
        importance_sampling=False,
    )


class ChatTask:
    """A chat family as a GRPO task: each prompt rendered as text by the tokenizer's chat template, scored by id.

    ``rows()`` gives ``{"prompt": text, "prompt_id"}`` (TRL tokenizes the text without adding special tokens, which
    gives exactly ``record.chat_ids``); ``reward_func`` looks each completion's problem up by its ``prompt_id``.
    """

    def __init__(self, family: ChatFamily, tokenizer: Any) -> None:
        self.family = family
        self.prompts = {p.prompt_id: p for p in family.prompts}
        self.texts = {p.prompt_id: tokenizer.decode(chat_ids(tokenizer, p.text)) for p in family.prompts}

    def rows(self) -> list[dict[str, object]]:
        return [{"prompt": self.texts[pid], "prompt_id": pid} for pid in self.prompts]

    def reward_func(self, prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        """TRL reward-function form (``prompt_id`` is the data set's column, passed by TRL as a keyword)."""
        ids = kwargs.get("prompt_id")
        if ids is None or len(ids) != len(completions):
            raise ValueError("ChatTask.reward_func needs prompt_id=[one id per completion] (the data-set column)")
        unknown = sorted({pid for pid in ids if pid not in self.prompts})
        if unknown:
            raise ValueError(f"prompt ids {unknown[:3]} are not in the {self.family.name!r} prompt set")
        return [self.family.reward(self.prompts[pid], text) for pid, text in zip(ids, completions)]


def demo_family(name: str, num_prompts: int, seed: int = 0) -> ChatFamily:
    """The demo's task family; the held-out family is refused (it stays out of every tuned run)."""
    if name in HELD_OUT:
        raise ValueError(f"family {name!r} is held out of tuning; use another family for the demo (e.g. arith)")
    return make_family(name, num_prompts, seed)


def warmup_fields(cfg: RecordConfig) -> dict[str, Any]:
    """The fields of ``cfg`` the warm-up uses (the rest of ``RecordConfig`` shapes a trace recording)."""
    return {k: getattr(cfg, k) for k in WARMUP_FIELDS}


def warmup_key(base_dir: str | os.PathLike, cfg: RecordConfig) -> str:
    """Short hash of the base model's name and the warm-up fields of ``cfg`` (the cache directory's name)."""
    blob = {"format": WARMUP_FORMAT, "base": Path(base_dir).name, **warmup_fields(cfg)}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def warmed_policy(base_dir: str | os.PathLike, cfg: RecordConfig = WARMUP, cache_dir: str | os.PathLike | None = None,
                  progress: bool = True) -> Path:  # fmt: skip
    """The base model after the supervised warm-up of ``cfg`` (``record.warmup``), trained once and cached.

    Returns ``<cache>/demo-policies/<base name>-<family>-<hash>`` (an HF directory, written atomically); with
    ``cfg.warmup_examples == 0`` the untouched base model directory itself.
    """
    if not cfg.warmup_examples or not cfg.warmup_epochs:
        return Path(base_dir)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / "demo-policies" / f"{Path(base_dir).name}-{cfg.family}-{warmup_key(base_dir, cfg)}"

    def build(tmp: Path) -> dict:
        seconds = _warm_up(base_dir, cfg, tmp, progress)
        return {"base": str(base_dir), "config": warmup_fields(cfg), "seconds": seconds}

    return cached_build(final, WARMUP_META, build)


def _warm_up(base_dir: str | os.PathLike, cfg: RecordConfig, out: Path, progress: bool) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_histospec.trace.record import warmup

    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    warmup(model, tokenizer, make_family(cfg.family, cfg.num_prompts, cfg.seed), cfg, progress)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return time.perf_counter() - start


def warmup_meta(policy_dir: str | os.PathLike) -> dict | None:
    """The warm-up record of a cached policy (``base``, ``config``, ``seconds``), or None for an untouched model."""
    path = Path(policy_dir) / WARMUP_META
    return json.loads(path.read_text()) if path.is_file() else None
