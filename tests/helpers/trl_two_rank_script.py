"""Run by ``torchrun --nproc_per_node 2`` from tests/trl/test_torchrun.py: HistoSpecGRPOTrainer on two CPU ranks.

Usage: ``torchrun --nproc_per_node 2 tests/helpers/trl_two_rank_script.py MODEL_DIR SERVER_URL OUT_DIR``; each rank writes
``OUT_DIR/rank<r>.json`` (synced steps, history pushes, per-generation sample counts, step logs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from accelerate import PartialState  # noqa: E402

from tests.helpers.trl_harness import length_reward, tiny_dataset, tiny_grpo_kwargs  # noqa: E402


def main(model_dir: str, url: str, out_dir: str) -> None:
    state = PartialState(cpu=True)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    Path(out_dir, f"pid{state.process_index}").write_text(str(os.getpid()))  # the test ends strays by pid
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_integration import HistoSpecGRPOConfig, HistoSpecGRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    # per rank 2 samples, 4 per group: every group is split across the two ranks
    args = HistoSpecGRPOConfig(
        output_dir=out_dir, rollout_urls=[url], **tiny_grpo_kwargs(per_device_train_batch_size=2, max_steps=2)
    )
    trainer = HistoSpecGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=length_reward,
        args=args,
        train_dataset=tiny_dataset(2, id_prefix="ddp-"),
        processing_class=tok,
    )
    trainer.train()
    result = {
        "world_size": state.num_processes,
        "synced_steps": trainer.histospec.synced_steps,
        "history_pushes": trainer.history_pushes,
        "samples_per_generation": [len(r.completions) for r in trainer.recent_generations],
        "prompt_ids": [r.prompt_ids for r in trainer.recent_generations],
        "logs": [h for h in trainer.state.log_history if "loss" in h],
    }
    Path(out_dir, f"rank{state.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    main(*sys.argv[1:4])
