"""GRPO with TRL on a small in-memory data set, rollouts on a local HistoSpec server (CPU is enough).

The data set is the demo's arithmetic task (8 prompts with stable ids, a verifiable reward); the policy is the demo's
small pretrained model (trained once and cached, about a minute on 2 cores with ``--quick``). Each epoch revisits
the same prompts, so from the second epoch on the server drafts from the previous epoch's responses: watch
``histospec/tau`` (tokens per verify step) rise above 1 in the printed metrics.

Usage::

    python examples/grpo_histospec.py --quick                   # starts `histospec serve` on a free port itself
    python examples/grpo_histospec.py --url http://127.0.0.1:30000 --model DIR   # an already running server

The last stdout line is a JSON summary (per-step reward, tau, accepted/drafted, history tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def start_server(model_dir: str) -> tuple[subprocess.Popen, str]:
    """``histospec serve --backend torch`` on a free loopback port; returns (process, url) once it is healthy."""
    from sglang_histospec.server.client import HistoSpecClient
    from sglang_histospec.server.launch import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "sglang_histospec.cli", "serve", "--backend", "torch", "--model", model_dir]
    proc = subprocess.Popen([*cmd, "--port", str(port), "--device", "cpu", "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    with HistoSpecClient(url) as client:
        deadline = time.monotonic() + 300
        while not client.health():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"`{' '.join(cmd)}` did not come up")
            time.sleep(0.5)
    return proc, url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running rollout server (default: start one)")
    parser.add_argument("--model", default=None, help="model directory (default: the demo model)")
    parser.add_argument("--quick", action="store_true", help="the demo's quick model (pretrains in about a minute)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_histospec.models.demo_model import build_or_load_demo_model
    from sglang_histospec.tasks.arith import ArithTask, TaskConfig
    from trl_integration import HistoSpecGRPOConfig, HistoSpecGRPOTrainer

    model_dir = args.model or str(build_or_load_demo_model(quick=args.quick))
    task = ArithTask(TaskConfig(seed=0, num_prompts=args.num_prompts))
    dataset = Dataset.from_dict(
        {"prompt": [p.text for p in task.prompts], "prompt_id": [p.prompt_id for p in task.prompts]}
    )

    def correct(prompts, completions, **kwargs):
        return [task.reward(p, c) for p, c in zip(prompts, completions)]

    server, url = (None, args.url) if args.url else start_server(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.padding_side = "left"
        per_step_prompts = 2
        config = HistoSpecGRPOConfig(
            output_dir=args.output_dir or tempfile.mkdtemp(prefix="grpo-histospec-"),
            rollout_urls=[url],
            num_generations=8,
            per_device_train_batch_size=8 * per_step_prompts,
            max_completion_length=48,
            max_steps=args.epochs * args.num_prompts // per_step_prompts,
            learning_rate=2e-5,
            logging_steps=1,
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
        trainer = HistoSpecGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            reward_funcs=correct,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.train()
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    keys = ("reward", "histospec/tau", "histospec/accept_rate", "histospec/history_tokens")
    steps = [{k: h.get(k) for k in ("step", *keys)} for h in trainer.state.log_history if "histospec/tau" in h]
    print(json.dumps({"model": model_dir, "steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
