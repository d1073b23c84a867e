"""Distributed weight sync (NCCL group + ``/update_weights_from_distributed``) against a real SGLang server on a GPU.

Needs a running SGLang 0.5.23 server (``histospec serve --backend sglang`` or plain ``sglang.launch_server``) on a
GPU other than the trainer's, serving the model at ``$HISTOSPEC_GPU_MODEL``; its URL in ``$HISTOSPEC_GPU_URL``.
Skipped otherwise (the torch-backend server has no distributed weight routes; CPU runs use the disk path).
"""

from __future__ import annotations

import os

import pytest
import torch
import trl  # noqa: F401  (a hard test dependency: `make test` installs it; missing, it must fail)

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]


@pytest.fixture
def gpu_server():
    url, model = os.environ.get("HISTOSPEC_GPU_URL"), os.environ.get("HISTOSPEC_GPU_MODEL")
    if not torch.cuda.is_available() or not url or not model:
        pytest.skip("needs CUDA plus a running SGLang server: set HISTOSPEC_GPU_URL and HISTOSPEC_GPU_MODEL")
    pytest.importorskip("sglang.srt.utils")
    return url, model


def test_distributed_sync_gives_the_server_the_trainers_weights(gpu_server, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.trl_harness import length_reward, tiny_dataset
    from trl_integration import HistoSpecGRPOConfig, HistoSpecGRPOTrainer

    url, model_dir = gpu_server
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    args = HistoSpecGRPOConfig(
        output_dir=str(tmp_path), rollout_urls=[url], weight_sync="distributed", report_to="none", max_steps=2,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=16, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", bf16=False,
    )  # fmt: skip
    trainer = HistoSpecGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=length_reward,
        args=args,
        train_dataset=tiny_dataset(2, id_prefix="gpu-"),
        processing_class=tok,
    )
    trainer.train()
    assert trainer.histospec.synced_steps == [0, 1]
    for h in (h for h in trainer.state.log_history if "loss" in h):
        assert h["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=2e-2)  # bf16 server
