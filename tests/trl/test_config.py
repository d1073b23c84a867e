"""HistoSpecGRPOConfig validation (no server needed)."""

from __future__ import annotations

import pytest
import trl  # noqa: F401  (a hard test dependency: `make test` installs it; missing, it must fail)

from trl_integration import HistoSpecGRPOConfig

BASE = dict(use_cpu=True, bf16=False, report_to="none", num_generations=2, per_device_train_batch_size=2)


def make(tmp_path, **kw):
    return HistoSpecGRPOConfig(output_dir=str(tmp_path), **{**BASE, **kw})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "rollout_urls is not set"),
        ({"rollout_urls": ["http://a:1"], "use_vllm": True}, "leave use_vllm=False"),
        ({"rollout_urls": ["http://a:1"], "weight_sync": "nccl"}, "weight_sync='nccl'"),
        ({"rollout_urls": ["http://a:1"], "request_timeout": 0}, "must be positive"),
        ({"rollout_urls": ["http://a:1"], "remove_unused_columns": True, "hash_prompt_ids": False}, "drops the"),
    ],
)
def test_config_errors(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(tmp_path, **kwargs)


def test_config_defaults_and_url_string(tmp_path, monkeypatch):
    monkeypatch.setenv("HISTOSPEC_ADMIN_API_KEY", "k")
    args = make(tmp_path, rollout_urls="http://a:1,http://b:2")
    assert args.rollout_urls == ["http://a:1", "http://b:2"]
    assert (args.prompt_id_column, args.hash_prompt_ids, args.push_history, args.weight_sync) == (
        "prompt_id",
        True,
        True,
        "disk",
    )
    assert args.weight_sync_dir == str(tmp_path / "histospec-weights")
    assert args.rollout_admin_api_key == "k"
    with pytest.warns(UserWarning, match="fall back to hashes"):
        make(tmp_path, rollout_urls=["http://a:1"], remove_unused_columns=True)
