"""The demo's tiny causal LM: built, pretrained (supervised) on CPU on the arithmetic task, cached on disk.

:func:`build_or_load_demo_model` is the entry point (also the default model of ``histospec bench engine``): it
returns a directory that ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` and the
embedded engine load. The directory name is a hash of the whole :class:`DemoModelConfig`, so a second call with
the same configuration skips training.

Pretraining stops early once the model's mean reward at temperature 1 on the task's fixed RL prompt set reaches
``target_reward`` (checked every ``eval_every`` steps), so the model leaves GRPO room to improve while sampling
diverse but recurring solutions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglang_histospec.models.cache import cached_build, default_cache_dir
from sglang_histospec.models.demo_tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from sglang_histospec.tasks.arith import ArithTask, TaskConfig

# Bump when the training recipe or the saved layout changes, so stale cache entries are not reused.
CACHE_FORMAT = 1
META_FILE = "demo_meta.json"


@dataclass(frozen=True)
class DemoModelConfig:
    """Architecture and pretraining recipe of the demo model (every field enters the cache key)."""

    task: TaskConfig = field(default_factory=TaskConfig)
    """The task whose solutions the model is pretrained on."""
    arch: str = "llama"
    """``llama`` or ``qwen2`` (transformers configs)."""
    hidden_size: int = 64
    """Model width."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 192
    """MLP width."""
    max_positions: int = 128
    """Maximum sequence length (prompt + completion, in characters + 2)."""
    train_examples: int = 20_000
    """Number of distinct (prompt, solution) pairs in the supervised corpus."""
    max_steps: int = 2000
    """Upper bound on optimizer steps."""
    batch_size: int = 64
    """Sequences per optimizer step."""
    learning_rate: float = 1e-2
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10% over ``max_steps``)."""
    warmup_steps: int = 50
    """Linear warm-up steps."""
    target_reward: float | None = 0.35
    """Stop once the mean T=1 reward on the RL prompt set reaches this; None trains all ``max_steps``."""
    eval_every: int = 100
    """Steps between reward evaluations (only when ``target_reward`` is set)."""
    eval_samples: int = 4
    """Samples per RL prompt in each reward evaluation."""
    max_new_tokens: int = 48
    """Completion length cap when sampling for evaluation."""
    seed: int = 0
    """Seed of model initialisation, corpus order and evaluation sampling."""

    def __post_init__(self) -> None:
        if self.arch not in ("llama", "qwen2"):
            raise ValueError(f"arch={self.arch!r}: use 'llama' or 'qwen2'")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}: "
                "hidden_size must divide by num_heads and num_heads by num_kv_heads"
            )
        for name in ("max_steps", "batch_size", "train_examples", "eval_every", "eval_samples", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.target_reward is not None and not 0.0 < self.target_reward <= 1.0:
            raise ValueError(f"target_reward={self.target_reward}: use a value in (0, 1] or None")

    def cache_key(self) -> str:
        """Short hash of the configuration and :data:`CACHE_FORMAT` (the cache directory's name)."""
        blob = json.dumps({"format": CACHE_FORMAT, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# The quick variant (``--quick`` of the demo and the engine benchmark): the same model, pretrained to a lower
# reward (about 900 steps instead of about 1300 with the default seed).
QUICK_CONFIG = DemoModelConfig(max_steps=1200, target_reward=0.25)

# The converged variant (default model of ``histospec bench engine``): the same architecture and task, pretrained
# for up to 12000 steps (about 10 minutes on one core) instead of stopping at reward 0.35, as a policy is after
# more (RL) training: higher reward, lower entropy, responses of one prompt that rhyme more. The GRPO demo keeps
# the default config so that RL has room to improve.
CONVERGED_CONFIG = DemoModelConfig(max_steps=12000, target_reward=0.85, eval_every=1000)

DEMO_MODELS = {"converged": CONVERGED_CONFIG, "grpo": DemoModelConfig(), "quick": QUICK_CONFIG}
"""The named demo model configurations (``histospec bench engine --demo-model NAME``)."""


@dataclass
class PretrainResult:
    """What one pretraining run did (also written to ``demo_meta.json`` next to the weights)."""

    steps: int
    """Optimizer steps taken."""
    losses: list[float]
    """Training loss (mean per completion token) at every step."""
    evals: list[dict[str, float]]
    """Reward evaluations: ``{"step", "reward", "distinct"}`` (distinct = distinct completions / samples)."""
    seconds: float
    """Wall time of the training loop, evaluations included."""
    num_params: int
    """Number of model parameters."""


def build_or_load_demo_model(
    cache_dir: str | os.PathLike | None = None,
    quick: bool = False,
    config: DemoModelConfig | None = None,
    progress: bool = True,
) -> Path:
    """Return the directory of the pretrained demo model, training it first unless it is cached.

    The default model of the engine benchmark (``histospec bench engine``) and of ``histospec demo``. The
    directory holds ``config.json``, ``model.safetensors``, the tokenizer files and ``demo_meta.json``; it is
    ``<cache_dir>/demo-models/<config hash>``, written atomically, so concurrent callers never see a half-written
    model. ``quick`` selects :data:`QUICK_CONFIG` (seconds to a minute) when no ``config`` is given.

    Example:
        >>> path = build_or_load_demo_model(quick=True)          # trains once (about a minute on 2 cores)
        >>> model = AutoModelForCausalLM.from_pretrained(path)   # later calls return at once
    """
    cfg = config or (QUICK_CONFIG if quick else DemoModelConfig())
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / "demo-models" / cfg.cache_key()

    def build(tmp: Path) -> dict:
        result = pretrain(cfg, tmp, progress=progress)
        return {"config": dataclasses.asdict(cfg), "result": dataclasses.asdict(result)}

    return cached_build(final, META_FILE, build)


def load_meta(model_dir: str | os.PathLike) -> dict:
    """The ``demo_meta.json`` of a model directory (its config and :class:`PretrainResult`)."""
    path = Path(model_dir) / META_FILE
    if not path.is_file():
        raise ValueError(f"{model_dir}: no {META_FILE}; pass a directory made by build_or_load_demo_model")
    return json.loads(path.read_text())


def make_model(cfg: DemoModelConfig, vocab_size: int):
    """A freshly initialised transformers causal LM for ``cfg`` (seeded by ``cfg.seed``)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=True,
    )
    hf_config = LlamaConfig(**kwargs) if cfg.arch == "llama" else Qwen2Config(**kwargs)
    torch.manual_seed(cfg.seed)
    return AutoModelForCausalLM.from_config(hf_config)


def encode_examples(tokenizer, pairs: list[tuple[str, str]], max_len: int):
    """Token ids and loss labels of (prompt, solution) pairs, right-padded to the longest.

    Returns ``(input_ids [N, L] int64, labels [N, L] int64)``; labels are -100 on the prompt (incl. ``<s>``) and
    on padding, so the loss covers the completion and its ``</s>``.
    """
    import torch

    rows, labels = [], []
    for prompt, solution in pairs:
        p = tokenizer(prompt).input_ids
        c = tokenizer(solution, add_special_tokens=False).input_ids + [EOS_ID]
        if len(p) + len(c) > max_len:
            raise ValueError(f"example {prompt + solution!r} has {len(p) + len(c)} tokens > max_positions={max_len}")
        rows.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, y) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(y)] = torch.tensor(y)
    return ids, lab


def pretrain(
    cfg: DemoModelConfig, out_dir: str | os.PathLike, progress: bool = True, num_threads: int | None = 1
) -> PretrainResult:
    """Train the demo model on sampled task solutions and save model + tokenizer to ``out_dir``.

    Deterministic in ``cfg.seed`` on a given machine and thread count. ``num_threads`` (torch intra-op threads
    during training, restored afterwards; None keeps torch's setting) defaults to 1: models this small gain
    little from a second thread, and on a shared 2-core machine two OpenMP threads ran 17x slower per step
    than one (measured with other jobs running).
    """
    import torch

    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _pretrain(cfg, out_dir, progress)
    finally:
        torch.set_num_threads(previous)


def _pretrain(cfg: DemoModelConfig, out_dir: str | os.PathLike, progress: bool) -> PretrainResult:
    import torch
    from tqdm.auto import tqdm

    task = ArithTask(cfg.task)
    tokenizer = build_tokenizer()
    model = make_model(cfg, len(tokenizer))
    ids, labels = encode_examples(tokenizer, task.training_texts(cfg.train_examples, cfg.seed), cfg.max_positions)
    attention = (ids != PAD_ID).long()
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.01, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_at)
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(ids), generator=gen)
    losses: list[float] = []
    evals: list[dict[str, float]] = []
    start = time.perf_counter()
    model.train()
    bar = tqdm(range(cfg.max_steps), desc="pretrain demo model", disable=not progress, unit="step")
    cursor = 0
    postfix: dict[str, str] = {}
    for step in bar:
        if cursor + cfg.batch_size > len(order):
            order, cursor = torch.randperm(len(ids), generator=gen), 0
        batch = order[cursor : cursor + cfg.batch_size]
        cursor += cfg.batch_size
        width = int(attention[batch].sum(1).max())
        out = model(
            input_ids=ids[batch, :width], attention_mask=attention[batch, :width], labels=labels[batch, :width]
        )
        optim.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        losses.append(out.loss.item())
        postfix["loss"] = f"{losses[-1]:.3f}"
        bar.set_postfix(postfix, refresh=False)
        if cfg.target_reward is not None and (step + 1) % cfg.eval_every == 0:
            reward, distinct = evaluate_reward(model, tokenizer, task, cfg.eval_samples, cfg.max_new_tokens, cfg.seed)
            evals.append({"step": step + 1, "reward": reward, "distinct": distinct})
            postfix["reward"] = f"{reward:.2f}"
            model.train()
            if reward >= cfg.target_reward:
                break
    bar.close()
    model.eval()
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.bos_token_id = BOS_ID
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return PretrainResult(
        steps=len(losses),
        losses=losses,
        evals=evals,
        seconds=time.perf_counter() - start,
        num_params=sum(p.numel() for p in model.parameters()),
    )


def sample_completions(model, tokenizer, prompts: list[str], max_new_tokens: int, seed: int) -> list[str]:
    """Decode one T=1 sample per prompt with ``model.generate`` (special tokens stripped)."""
    import torch

    torch.manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
        )
    return tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)


def evaluate_reward(
    model, tokenizer, task: ArithTask, samples: int, max_new_tokens: int, seed: int
) -> tuple[float, float]:
    """(mean T=1 reward, distinct completions / samples) over ``samples`` samples of every RL prompt."""
    model.eval()
    prompts = [p.text for p in task.prompts for _ in range(samples)]
    completions = sample_completions(model, tokenizer, prompts, max_new_tokens, seed)
    rewards = task.reward_func(prompts, completions)
    distinct = len(set(zip(prompts, completions))) / len(prompts)
    return sum(rewards) / len(rewards), distinct
