"""``HistoSpecGRPOConfig``: TRL's ``GRPOConfig`` plus where the rollout servers are and how to talk to them.

Example::

    args = HistoSpecGRPOConfig(output_dir="out", rollout_urls=["http://127.0.0.1:30000"], num_generations=8)
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

WEIGHT_SYNC_MODES = ("disk", "distributed")


@dataclass
class HistoSpecGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with the rollout-server fields below; ``use_vllm`` must stay False (the servers generate)."""

    rollout_urls: list[str] | str | None = field(
        default=None,
        metadata={
            "help": "URLs of `histospec serve` servers (either backend) or of the router; a comma-separated string "
            "is split. Prompts are spread over several servers by prompt id; weights and history go to all."
        },
    )
    prompt_id_column: str = field(
        default="prompt_id",
        metadata={"help": "Dataset column holding each prompt's stable id (the history key)."},
    )
    hash_prompt_ids: bool = field(
        default=True,
        metadata={
            "help": "When a row has no `prompt_id_column`, use the servers' hash of its prompt tokens as id "
            "('tokens:' + SHA-1); False makes a missing id an error."
        },
    )
    push_history: bool = field(
        default=True,
        metadata={
            "help": "After each generation's rewards are known, push its responses and rewards per prompt id to "
            "/histospec/history on every server (main process, gathered across ranks)."
        },
    )
    trace_path: str | None = field(
        default=None,
        metadata={
            "help": "Write every training generation here in the trace format (.jsonl or .jsonl.gz: "
            "`histospec replay` reads it), one append per step with rewards and logprobs, flushed and fsynced "
            "(main process). An existing file keeps its steps below the run's first step (a resumed run)."
        },
    )
    request_timeout: float = field(
        default=600.0, metadata={"help": "Seconds an HTTP call to a rollout server may take (a whole /generate)."}
    )
    server_ready_timeout: float = field(
        default=60.0, metadata={"help": "Seconds to wait for the servers' /health at start before failing."}
    )
    rollout_admin_api_key: str | None = field(
        default=None,
        metadata={
            "help": "The servers' --admin-api-key (history and weight routes); default $HISTOSPEC_ADMIN_API_KEY."
        },
    )
    check_tokenizer: bool = field(
        default=True,
        metadata={"help": "At start, fail when the trainer's tokenizer or vocabulary differs from a server's."},
    )
    weight_sync: str = field(
        default="disk",
        metadata={
            "help": "'disk': save a checkpoint and POST /update_weights_from_disk (servers must read weight_sync_dir);"
            " 'distributed': NCCL broadcast via /init_weights_update_group + /update_weights_from_distributed "
            "(SGLang servers on GPUs)."
        },
    )
    weight_sync_dir: str | None = field(
        default=None, metadata={"help": "Checkpoint directory of disk syncs; default <output_dir>/histospec-weights."}
    )
    weight_sync_master_address: str = field(
        default="127.0.0.1", metadata={"help": "Distributed sync: the trainer's address, reachable by the servers."}
    )
    weight_sync_master_port: int = field(default=29555, metadata={"help": "Distributed sync: a free TCP port."})
    weight_sync_backend: str = field(default="nccl", metadata={"help": "Distributed sync: torch.distributed backend."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.rollout_urls, str):
            self.rollout_urls = [u for u in self.rollout_urls.split(",") if u.strip()]
        if not self.rollout_urls:
            raise ValueError(
                "rollout_urls is not set; start a server (`histospec serve --backend torch --model MODEL_DIR`) and "
                "pass rollout_urls=['http://127.0.0.1:30000']"
            )
        if self.use_vllm:
            raise ValueError("use_vllm=True: HistoSpecGRPOTrainer generates on rollout_urls; leave use_vllm=False")
        if self.weight_sync not in WEIGHT_SYNC_MODES:
            raise ValueError(f"weight_sync={self.weight_sync!r}; use one of {WEIGHT_SYNC_MODES}")
        if self.request_timeout <= 0 or self.server_ready_timeout <= 0:
            raise ValueError("request_timeout and server_ready_timeout must be positive seconds")
        if self.trace_path is not None and (not self.trace_path or os.path.isdir(self.trace_path)):
            raise ValueError(f"trace_path={self.trace_path!r}: give a file path, e.g. 'out/trace.jsonl.gz'")
        if self.rollout_admin_api_key is None:
            self.rollout_admin_api_key = os.environ.get("HISTOSPEC_ADMIN_API_KEY") or None
        if self.weight_sync_dir is None:
            self.weight_sync_dir = os.path.join(self.output_dir or ".", "histospec-weights")
        if self.remove_unused_columns:
            message = (
                f"remove_unused_columns=True drops the {self.prompt_id_column!r} column before the trainer sees it; "
                "set remove_unused_columns=False (GRPO's default)"
            )
            if not self.hash_prompt_ids:
                raise ValueError(f"{message} or hash_prompt_ids=True")
            warnings.warn(f"{message}; prompt ids fall back to hashes of the prompts", stacklevel=2)
