"""``histospec bench draft``: the draft-cost benchmark on a trace (its workload, its keys, its errors)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from sglang_histospec.cli import main
from sglang_histospec.drafting.drafter import DrafterConfig
from sglang_histospec.replay.draft_bench import DraftBenchConfig, run_draft_bench
from sglang_histospec.trace.format import TraceStep
from sglang_histospec.trace.synth import SynthConfig, generate


def steps_of(records):
    by: dict[int, TraceStep] = {}
    for r in records:
        by.setdefault(r.step, TraceStep(r.step)).records.append(r)
    return [by[s] for s in sorted(by)]


SYNTH = steps_of(generate(SynthConfig(prompts=4, group_size=3, epochs=3, mean_len=80, vocab=300, seed=3)))
KEYS = {
    "batch", "budget", "threads", "rounds", "history_tokens", "draft_call_us_p50", "draft_call_us_p99", "draft_us_p50",
    "draft_us_p99", "extend_us_p50", "tau", "drafts_sha1", "draft_threads", "draft_call_us_p50_threads",
}  # fmt: skip


def test_keys_and_per_request_figures():
    cfg = DraftBenchConfig(batch=16, budget=4, rounds=3, warmup=1, draft_threads=2, ngram=False)
    res = run_draft_bench(SYNTH, cfg)
    out = res.to_json()
    assert out.keys() >= KEYS
    assert out["rounds"] == 3 and len(res.extend_call_us) == 3 and len(res.draft_call_us_threads) == 3
    assert out["draft_us_p50"] == pytest.approx(out["draft_call_us_p50"] / 16, abs=1e-3)
    assert out["history_tokens"] == sum(len(r.response) for st in SYNTH[:-1] for r in st.records)
    assert res.verify_steps == 3 * 16 and out["tau"] >= 1.0 and res.drafted > 0
    assert "ngram_batch_get_us_p50" not in out


def test_drafts_do_not_depend_on_timing_or_threads():
    """The same seed gives the same drafts (the digest), whatever the second drafter's threads."""
    base = DraftBenchConfig(batch=12, budget=6, rounds=3, warmup=0, ngram=False)
    one = run_draft_bench(SYNTH, replace(base, draft_threads=1)).to_json()
    two = run_draft_bench(SYNTH, replace(base, draft_threads=3)).to_json()
    other = run_draft_bench(SYNTH, replace(base, seed=1)).to_json()
    assert one["drafts_sha1"] == two["drafts_sha1"] != other["drafts_sha1"]


def test_python_backend_drafts_as_the_native_one():
    cfg = DraftBenchConfig(batch=6, budget=4, rounds=2, warmup=1, draft_threads=1, ngram=False)
    native = run_draft_bench(SYNTH, cfg, DrafterConfig(backend="native")).to_json()
    python = run_draft_bench(SYNTH, cfg, DrafterConfig(backend="python")).to_json()
    assert native["drafts_sha1"] == python["drafts_sha1"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"batch": 0}, "batch=0"), ({"rounds": -1}, "rounds=-1"), ({"draft_threads": 0}, "draft_threads=0")],
)
def test_config_errors(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        DraftBenchConfig(**kwargs)


def test_needs_history():
    with pytest.raises(ValueError, match="needs history"):
        run_draft_bench(SYNTH[:1], DraftBenchConfig(batch=2, rounds=1, ngram=False))


def test_cli_json(tmp_path, capsys):
    path = tmp_path / "t.jsonl.gz"
    assert (
        main(["trace", "synth", str(path), "--prompts", "3", "--group-size", "2", "--epochs", "2", "--vocab", "200"])
        == 0
    )
    capsys.readouterr()
    args = ["bench", "draft", str(path), "--batch", "8", "--rounds", "2", "--warmup", "0", "--no-ngram", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["batch"] == 8 and out["rounds"] == 2 and out["trace"] == str(path)
    with pytest.raises(SystemExit, match="--batch=0"):
        main(["bench", "draft", str(path), "--batch", "0"])


@pytest.mark.slow  # the first use JIT-compiles SGLang's C++ (about 50 s)
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs `make install-peers`")
def test_ngram_on_the_same_windows():
    cfg = DraftBenchConfig(batch=8, budget=4, rounds=3, warmup=0, draft_threads=1)
    out = run_draft_bench(SYNTH, cfg).to_json()
    assert out["ngram_batch_get_us_p50"] > 0 and out["ngram_batch_put_us_p50"] > 0
    assert out["ratio"] == pytest.approx(out["draft_call_us_p50"] / out["ngram_batch_get_us_p50"], rel=1e-3)
