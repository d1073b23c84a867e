"""The SGLang worker's durable history and our limits on SGLang's app, without SGLang (issue 44): TP rank 0 logs
and compacts, other ranks restore the same state read only; ``--histospec-*`` arguments and raw /generate checks."""

from __future__ import annotations

import json
import os

import pytest

from sglang_histospec.drafting.drafter import DrafterConfig
from sglang_histospec.drafting.history_scan import LOG_NAME, SNAPSHOT_NAME
from sglang_histospec.plugin.durable import HISTORY_DIR_ENV, WorkerHistory, WorkerHistoryConfig
from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import FieldError, RequestLimits
from sglang_histospec.server.sglang_limits import (
    check_raw_generate,
    histospec_argv,
    shared_error,
    split_histospec_args,
)


def _push(step: int) -> dict:
    return {"op": "push", "step": step, "entries": [{"prompt_id": f"p{step}", "responses": [[5, 6, 7 + step]]}]}


def test_rank_0_logs_and_compacts_other_ranks_restore_the_same(tmp_path) -> None:
    cfg = WorkerHistoryConfig(directory=str(tmp_path), snapshot_log_bytes=300)
    rank0 = WorkerHistory(cfg, tp_rank=0, drafter_config=DrafterConfig())
    drafter = rank0.restore()
    for step in range(4):
        record = _push(step)
        drafter.add(f"p{step}", step, record["entries"][0]["responses"])
        rank0.log(record, drafter)
    assert os.path.exists(tmp_path / SNAPSHOT_NAME)  # the log passed 300 bytes: compacted
    drafter.end_step(3)
    rank0.log({"op": "end_step", "step": 3}, drafter)
    log_size = os.path.getsize(tmp_path / LOG_NAME)
    rank1 = WorkerHistory(cfg, tp_rank=1, drafter_config=DrafterConfig())
    assert rank1.store is None  # reads only
    follower = rank1.restore()
    assert os.path.getsize(tmp_path / LOG_NAME) == log_size
    assert all(follower.has_visit(f"p{s}", s) for s in range(4)) and follower.open_step == 4
    restarted = WorkerHistory(cfg, tp_rank=0, drafter_config=DrafterConfig()).restore()
    assert restarted.stats() == follower.stats()


def test_without_a_directory_history_is_in_memory(tmp_path) -> None:
    store = WorkerHistory(WorkerHistoryConfig.from_env({}), tp_rank=0, drafter_config=DrafterConfig())
    drafter = store.restore()
    store.log(_push(0), drafter)
    store.compact(drafter)
    assert store.problem is None and not os.listdir(tmp_path)
    assert WorkerHistoryConfig.from_env({HISTORY_DIR_ENV: str(tmp_path)}).directory == str(tmp_path)


def test_histospec_arguments_leave_sglangs_alone_and_round_trip() -> None:
    argv = ["--model-path", "m", "--histospec-history-dir", "/h", "--port", "1", "--histospec-max-n", "4"]
    config, rest = split_histospec_args(argv)
    assert rest == ["--model-path", "m", "--port", "1"]
    assert config.history_dir == "/h" and config.limits.max_n == 4
    again, none_left = split_histospec_args(histospec_argv(config))
    assert again == config and none_left == []
    with pytest.raises(ValueError):
        split_histospec_args(["--histospec-max-n", "0"])


LIMITS = RequestLimits(max_text_chars=10, max_prompts=3, max_n=4, max_samples=8, max_id_chars=5)
RAW = [
    # body, field named (None: within the limits)
    ({"text": "short"}, None),
    ({"text": "x" * 11}, "text"),
    ({"text": ["abcde", "abcdef"]}, "text"),
    ({"input_ids": [[1], [2], [3], [4]]}, "input_ids"),
    ({"input_ids": [1, 2, 3, 4, 5]}, None),
    ({"input_ids": [1], "sampling_params": {"n": 5}}, "sampling_params.n"),
    ({"input_ids": [[1], [2], [3]], "sampling_params": {"n": 3}}, "sampling_params.n"),
    ({"input_ids": [1], "rid": "longer-than-5"}, "rid"),
    ({"input_ids": [1], "sampling_params": {"custom_params": {"prompt_id": "p" * 6}}}, "sampling_params.custom_params.prompt_id"),
    ({"input_ids": [1], "sampling_params": {"stop": ["x"], "min_p": 0.1}, "stream": True, "lora_path": "a"}, None),
    ({"input_ids": [1], "sampling_params": {"seed": 3}}, "sampling_params.seed"),
    ({"input_ids": [1, 64]}, "input_ids[1]"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 600}}, "sampling_params.max_new_tokens"),
    ({"text": "hi", "sampling_params": [{"max_new_tokens": 512}]}, "sampling_params[0].max_new_tokens"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 511}}, None),
    ([1, 2], None),
]  # fmt: skip
MODEL = ModelLimits(vocab_size=64, context_len=512)


@pytest.mark.parametrize(("body", "field"), RAW)
def test_raw_generate_limits(body, field) -> None:
    if field is None:
        check_raw_generate("/generate", body, LIMITS, MODEL)
        return
    with pytest.raises(FieldError) as info:
        check_raw_generate("/generate", body, LIMITS, MODEL)
    assert info.value.field == field


def test_auto_truncate_leaves_the_context_to_sglang() -> None:
    check_raw_generate(
        "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 600}}, LIMITS, MODEL, False
    )


SGLANG_ERRORS = [
    # SGLang's own 4xx body, the field of the shared one
    ({"error": {"message": "top_p must be in (0, 1], got 2."}}, "sampling_params.top_p"),
    ({"error": {"message": "input_ids cannot be empty."}}, "input_ids"),
    ({"error": "invalid type: floating point `1e21`, expected i64"}, "body"),
    ({"object": "error", "message": '1 validation error: stop\n\n  File "/x.py", line 1'}, "body"),
    ({"error": {"message": "n: must be in [1, 4]", "field": "n"}}, "n"),
]


@pytest.mark.parametrize(("body", "field"), SGLANG_ERRORS)
def test_sglang_errors_in_the_shared_format(body, field) -> None:
    error = json.loads(shared_error(json.dumps(body).encode()))["error"]
    assert error["field"] == field
    assert error["message"].startswith(f"{field}: ") and "File" not in error["message"]
