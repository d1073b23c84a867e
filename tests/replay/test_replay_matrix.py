"""scripts/replay_matrix.py: override labels, the resumable cache and ``--no-oracle``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from sglang_histospec.trace.format import write_trace
from sglang_histospec.trace.synth import SynthConfig, generate

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("replay_matrix", ROOT / "scripts" / "replay_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_no_oracle_and_override_labels(tmp_path, capsys):
    trace, cache = tmp_path / "t.jsonl", tmp_path / "cache.jsonl"
    write_trace(trace, generate(SynthConfig(prompts=2, group_size=2, epochs=2, mean_len=20, vocab=50, seed=1)))
    main = _script().main
    common = [str(trace), "--drafters", "histospec", "--budgets", "4", "--cache", str(cache)]
    assert main([*common, "--no-oracle", "--hs", "window=1"]) == 0
    assert main(common) == 0
    rows = {r["label"]: r for r in map(json.loads, cache.read_text().splitlines())}
    assert set(rows) == {"histospec[window=1]", "histospec"}
    assert rows["histospec[window=1]"]["oracle_tau"] is None and rows["histospec"]["oracle_tau"] > 0
    assert main([*common, "--no-oracle"]) == 0  # cached: nothing recomputed, nothing appended
    assert len(cache.read_text().splitlines()) == 2
    assert "| histospec[window=1] |" in capsys.readouterr().out
