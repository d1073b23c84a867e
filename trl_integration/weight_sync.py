"""Push the trainer's weights to the rollout servers: through a checkpoint on disk, or over a process group.

``DiskWeightSync`` (works everywhere the servers can read the trainer's disk) and ``DistributedWeightSync`` (GPU
clusters, real SGLang servers; NCCL): the steps each takes, their classes' docstrings. No TRL import here.

Example::

    sync = DiskWeightSync(servers, "/tmp/run/histospec-weights")
    sync.sync(accelerator, model, step=4)      # every rank calls it
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from trl_integration.servers import RolloutServers

WEIGHTS_SUBDIR = "current"


def _unwrap(accelerator: Any, model: Any) -> Any:
    unwrapped = accelerator.unwrap_model(model)
    if hasattr(unwrapped, "peft_config"):
        raise ValueError(
            "weight sync of a PEFT model is not supported: merge the adapters (model.merge_and_unload()) or train "
            "the full model; the rollout server needs full weights"
        )
    return unwrapped


class DiskWeightSync:
    """Save + ``/update_weights_from_disk`` (the servers must see ``directory``: same machine or a shared disk).

    ``tokenizer`` (optional) is saved next to the weights at the first sync, so the directory is a complete model
    (a server can restart from it, and a server's ``tokenizer_path`` stays checkable after an update).

    ``DiskWeightSync`` (works everywhere the servers can read the trainer's disk): every rank takes part in
    ``accelerator.get_state_dict`` (a collective under ZeRO-3 / FSDP), the main process writes a safetensors checkpoint
    and POSTs ``/update_weights_from_disk`` with ``weight_version = str(global_step)`` to every server, then all ranks
    wait for it.
    """

    def __init__(self, servers: RolloutServers | None, directory: str, tokenizer: Any = None) -> None:
        self.servers = servers  # None on non-main ranks
        self.directory = os.path.abspath(directory)
        self.tokenizer = tokenizer
        self.syncs = 0

    def sync(self, accelerator: Any, model: Any, step: int) -> None:
        state_dict = accelerator.get_state_dict(model)  # every rank: a collective under ZeRO-3 / FSDP
        error: BaseException | None = None
        if accelerator.is_main_process:
            try:
                path = os.path.join(self.directory, WEIGHTS_SUBDIR)
                os.makedirs(path, exist_ok=True)
                _unwrap(accelerator, model).save_pretrained(path, state_dict=state_dict, safe_serialization=True)
                if self.tokenizer is not None and self.syncs == 0:
                    self.tokenizer.save_pretrained(path)
                assert self.servers is not None
                self.servers.update_weights_from_disk(path, weight_version=str(step))
            except BaseException as exc:  # re-raised after the barrier, so other ranks do not hang in it
                error = exc
        accelerator.wait_for_everyone()
        if error is not None:
            raise error
        self.syncs += 1


@dataclass(slots=True)
class DistributedSyncConfig:
    """Where the trainer's weight-update group listens (the trainer's main process is its rank 0)."""

    master_address: str = "127.0.0.1"
    """An address of the trainer's main process that every server can reach."""
    master_port: int = 29555
    backend: str = "nccl"
    group_name: str = "weight_update_group"
    server_world_sizes: tuple[int, ...] | None = None
    """Workers (TP x PP ranks) of each server, in ``rollout_urls`` order; None = each server's ``tp_size`` from
    ``/get_server_info`` (1 when absent)."""
    bucket_tensors: int = 64
    """Tensors announced per ``/update_weights_from_distributed`` call."""


class DistributedWeightSync:
    """NCCL broadcast from the trainer's main process to every server's workers (real SGLang servers on GPUs).

    The trainer side of the group is formed with SGLang's own helper (``sglang.srt.utils.init_custom_process_group``),
    so SGLang must be importable in the trainer's environment for this path.

    ``DistributedWeightSync`` (GPU clusters, real SGLang servers): the main process forms a process group
    with the servers' workers (``/init_weights_update_group``, trainer = rank 0) and broadcasts each tensor while
    ``/update_weights_from_distributed`` tells the servers its name, dtype and shape.
    """

    def __init__(self, servers: RolloutServers | None, config: DistributedSyncConfig) -> None:
        self.servers = servers
        self.config = config
        self.group: Any = None
        self.syncs = 0

    def _server_world_sizes(self) -> list[int]:
        assert self.servers is not None
        if self.config.server_world_sizes is not None:
            sizes = list(self.config.server_world_sizes)
            if len(sizes) != len(self.servers.urls):
                raise ValueError(f"server_world_sizes {sizes} needs one entry per rollout URL {self.servers.urls}")
            return sizes
        sizes = []
        for i in range(len(self.servers.urls)):
            try:
                info = self.servers.get_one(i, "/get_server_info")
            except Exception:  # noqa: BLE001 - servers without the route run one worker
                info = {}
            sizes.append(int(info.get("tp_size", 1)) * int(info.get("pp_size", 1)))
        return sizes

    def _init_group(self) -> None:
        try:
            from sglang.srt.utils import init_custom_process_group
        except ImportError as exc:
            raise ImportError(
                "weight_sync='distributed' forms the weight-update group with SGLang's init_custom_process_group; "
                "install sglang in the trainer's environment, or use weight_sync='disk'"
            ) from exc
        assert self.servers is not None
        sizes = self._server_world_sizes()
        world = 1 + sum(sizes)
        cfg = self.config
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        errors: list[BaseException] = []

        def announce(index: int, offset: int) -> None:
            body = {
                "master_address": cfg.master_address,
                "master_port": cfg.master_port,
                "rank_offset": offset,
                "world_size": world,
                "group_name": cfg.group_name,
                "backend": cfg.backend,
            }
            try:
                self.servers.post_one(index, "/init_weights_update_group", body)  # type: ignore[union-attr]
            except BaseException as exc:  # noqa: BLE001 - reported after the group forms or times out
                errors.append(exc)

        threads = [threading.Thread(target=announce, args=(i, off), daemon=True) for i, off in enumerate(offsets)]
        for t in threads:
            t.start()
        self.group = init_custom_process_group(
            backend=cfg.backend,
            init_method=f"tcp://{cfg.master_address}:{cfg.master_port}",
            world_size=world,
            rank=0,
            group_name=cfg.group_name,
        )
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def sync(self, accelerator: Any, model: Any, step: int) -> None:
        import torch
        import torch.distributed as dist

        state_dict = accelerator.get_state_dict(model)
        error: BaseException | None = None
        if accelerator.is_main_process:
            try:
                if self.group is None:
                    self._init_group()
                items = list(state_dict.items())
                size = self.config.bucket_tensors
                for start in range(0, len(items), size):
                    bucket = items[start : start + size]
                    last = start + size >= len(items)
                    body = {
                        "names": [n for n, _ in bucket],
                        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                        "shapes": [list(t.shape) for _, t in bucket],
                        "group_name": self.config.group_name,
                        "flush_cache": last,
                        "weight_version": str(step),
                    }
                    assert self.servers is not None
                    pending = self.servers.submit(self.servers.post, "/update_weights_from_distributed", body)
                    for _, tensor in bucket:
                        dist.broadcast(tensor.detach().to(accelerator.device).contiguous(), src=0, group=self.group)
                    for url, res in zip(self.servers.urls, pending.result()):
                        if not res.get("success", False):
                            raise RuntimeError(f"{url} refused a distributed weight update: {res.get('message')}")
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            except BaseException as exc:
                error = exc
        accelerator.wait_for_everyone()
        if error is not None:
            raise error
        self.syncs += 1
