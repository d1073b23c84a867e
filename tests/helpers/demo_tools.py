"""Shared by the toy-model tests: a demo-model configuration small enough to pretrain in seconds."""

from __future__ import annotations

from sglang_histospec.models.demo_model import DemoModelConfig
from sglang_histospec.tasks.arith import TaskConfig

TINY = DemoModelConfig(
    task=TaskConfig(seed=3, num_prompts=8),
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    train_examples=512,
    max_steps=40,
    batch_size=32,
    learning_rate=1e-2,
    warmup_steps=5,
    target_reward=None,
)
