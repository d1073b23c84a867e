"""HistoSpecGRPOTrainer on two CPU ranks (``torchrun --nproc_per_node 2``, gloo) against one rollout server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trl  # noqa: F401  (a hard test dependency: `make test` installs it; missing, it must fail)

from sglang_histospec.demo.server_process import RolloutServerProcess
from sglang_histospec.server.launch import free_port
from tests.helpers.tiny import make_tiny_model_dir
from tests.helpers.trl_harness import ENV

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "trl_two_rank_script.py"


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


pytestmark = pytest.mark.slow  # its own server plus two TRL processes: 112 s here (2 shared cores, load ~12)


def test_two_ranks_generate_their_slices_and_main_pushes_gathered_history(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "m", vocab_size=64)
    out = tmp_path / "out"
    with RolloutServerProcess(model_dir, log_path=str(tmp_path / "server.log")) as srv:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
            str(SCRIPT), model_dir, srv.url, str(out),
        ]  # fmt: skip
        env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:  # torchrun's workers run in their own sessions: end them too
            for pid_file in out.glob("pid*"):
                _kill(int(pid_file.read_text()))
            proc.kill()
            proc.wait()
            raise
        assert proc.returncode == 0, stderr[-4000:]
        stats = srv.client.stats()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for r in ranks:
        assert r["synced_steps"] == [0, 1]  # every rank takes part in each sync (a barrier)
        assert r["samples_per_generation"] == [2, 2]  # each rank generates its own slice of the group
    # one prompt per step, its 4 samples split 2 + 2 over the ranks, gathered and pushed by the main process only
    assert ranks[0]["history_pushes"] == [[0, 4], [1, 4]]
    assert ranks[1]["history_pushes"] == []
    for step in (0, 1):
        assert ranks[0]["prompt_ids"][step] == ranks[1]["prompt_ids"][step]
    assert stats["history_responses_pushed"] == 8 and stats["weight_updates"] == 2
    assert all(h["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4) for h in ranks[0]["logs"])
