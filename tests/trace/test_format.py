"""Trace format: round trip, gzip, documented errors for malformed lines, unsorted traces, synthetic traces."""

from __future__ import annotations

import gzip
import json

import pytest

from sglang_histospec.trace.format import TraceError, TraceRecord, iter_steps, load_steps, read_trace, write_trace
from sglang_histospec.trace.synth import SynthConfig, generate, write_synthetic

GOOD = {"step": 0, "prompt_id": "p", "sample": 0, "prompt": [1, 2], "response": [3, 4]}


def _write_lines(path, objs):
    with open(path, "w") as f:
        for o in objs:
            f.write((o if isinstance(o, str) else json.dumps(o)) + "\n")


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_round_trip(tmp_path, suffix):
    recs = [
        TraceRecord(0, "a", 0, [1], [2, 3], epoch=0, reward=1.0),
        TraceRecord(0, "a", 1, [1], [], epoch=0, reward=None),
        TraceRecord(1, "b", 0, [5, 6], [7], epoch=None, reward=-0.5),
        TraceRecord(1, "c", 0, [5], [8, 9], logprobs=[-0.25, 0.0]),
    ]
    path = tmp_path / f"t{suffix}"
    assert write_trace(path, recs) == 4
    assert list(read_trace(path)) == recs
    if suffix.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            assert json.loads(f.readline())["prompt_id"] == "a"


# (line content, expected fragment of the error message); the bad line is always line 2
BAD_LINES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({**GOOD, "step": -1}, "field 'step'"),
    ({**GOOD, "step": "3"}, "field 'step'"),
    ({**GOOD, "step": True}, "field 'step'"),
    ({k: v for k, v in GOOD.items() if k != "step"}, "field 'step': missing"),
    ({**GOOD, "prompt_id": ""}, "field 'prompt_id'"),
    ({**GOOD, "prompt_id": 7}, "field 'prompt_id'"),
    ({**GOOD, "sample": 1.5}, "field 'sample'"),
    ({**GOOD, "prompt": "abc"}, "field 'prompt'"),
    ({**GOOD, "response": [1, -2]}, "field 'response': element 1"),
    ({**GOOD, "response": [2**31]}, "field 'response': element 0"),
    ({**GOOD, "response": [1.0]}, "field 'response'"),
    ({k: v for k, v in GOOD.items() if k != "response"}, "field 'response': missing"),
    ({**GOOD, "epoch": -3}, "field 'epoch'"),
    ({**GOOD, "reward": "high"}, "field 'reward'"),
    ({**GOOD, "logprobs": [-0.5]}, "field 'logprobs': expected null or a list of"),
    ({**GOOD, "logprobs": [0.5] * len(GOOD["response"])}, "field 'logprobs': element 0"),
    ({**GOOD, "logprobs": [float("nan")] * len(GOOD["response"])}, "field 'logprobs': element 0"),
]


@pytest.mark.parametrize(("line", "fragment"), BAD_LINES)
def test_malformed_line_names_line_and_field(tmp_path, line, fragment):
    path = tmp_path / "bad.jsonl"
    _write_lines(path, [GOOD, line])
    with pytest.raises(TraceError, match=":2: ") as exc:
        list(read_trace(path))
    assert fragment in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_duplicates_and_inconsistent_prompts(tmp_path):
    path = tmp_path / "dup.jsonl"
    _write_lines(path, [GOOD, {**GOOD, "response": [9]}])
    with pytest.raises(TraceError, match=r":2: field 'sample': duplicate record .*first on line 1"):
        load_steps(path)
    _write_lines(path, [GOOD, {**GOOD, "sample": 1, "prompt": [9]}])
    with pytest.raises(TraceError, match=r":2: field 'prompt': prompt_id 'p' has a different prompt"):
        load_steps(path)


def test_unsorted_trace_is_sorted_by_load_and_refused_by_streaming(tmp_path):
    objs = [{**GOOD, "step": 1}, {**GOOD, "step": 0}, {**GOOD, "step": 1, "sample": 1}]
    path = tmp_path / "u.jsonl"
    _write_lines(path, objs)
    steps, was_sorted = load_steps(path)
    assert not was_sorted
    assert [s.step for s in steps] == [0, 1]
    assert [r.sample for r in steps[1].records] == [0, 1]
    with pytest.raises(TraceError, match=r":2: field 'step': trace is not sorted by step \(0 after 1\)"):
        list(iter_steps(path))
    sorted_path = tmp_path / "s.jsonl"
    write_trace(sorted_path, [r for s in steps for r in s.records])
    assert [[r.to_json() for r in s.records] for s in iter_steps(sorted_path)] == [
        [r.to_json() for r in s.records] for s in steps
    ]


def test_empty_and_missing(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(TraceError, match="no records"):
        load_steps(path)
    with pytest.raises(TraceError, match="no such trace file"):
        load_steps(tmp_path / "missing.jsonl")


def test_synth_shape_and_determinism(tmp_path):
    cfg = SynthConfig(prompts=6, group_size=3, epochs=2, steps_per_epoch=2, mean_len=40, vocab=50, seed=3)
    recs = list(generate(cfg))
    assert len(recs) == 6 * 3 * 2
    assert sorted({r.step for r in recs}) == [0, 1, 2, 3]
    assert all(r.response[-1] == 49 and min(r.response[:-1] or [1]) >= 1 for r in recs)
    assert all(r.epoch == r.step // 2 for r in recs)
    assert [r.to_json() for r in generate(cfg)] == [r.to_json() for r in recs]
    path = tmp_path / "s.jsonl.gz"
    assert write_synthetic(str(path), cfg) == len(recs)
    steps, was_sorted = load_steps(path)
    assert was_sorted and len(steps) == 4


def test_synth_drift_controls_similarity():
    """No drift and no sample noise: every epoch repeats the previous one's responses as a prefix-stable set."""
    from sglang_histospec.trace.kgrams import KeySet, prefix_match

    def reuse(drift):
        cfg = SynthConfig(prompts=8, group_size=2, epochs=2, mean_len=60, vocab=5000, drift=drift, seed=0)
        recs = list(generate(cfg))
        cov = tot = 0
        for pid in {r.prompt_id for r in recs}:
            ks = KeySet(4)
            for r in recs:
                if r.prompt_id == pid and r.epoch == 0:
                    ks.add(r.response)
            for r in recs:
                if r.prompt_id == pid and r.epoch == 1:
                    cov += int((prefix_match(r.response, 4, [ks]) >= 4).sum())
                    tot += len(r.response)
        return cov / tot

    low, high = reuse(0.0), reuse(0.9)
    assert low > high + 0.2


@pytest.mark.parametrize(
    ("rate", "lo", "hi", "share"), [(0.0, 3.0, 10.0, (0.0, 0.0)), (0.25, 3.0, 3.0, (0.15, 0.35)), (0.05, 3.0, 10.0, (0.01, 0.1))]
)  # fmt: skip
def test_synth_outliers_stretch_a_share_of_samples(rate, lo, hi, share):
    """Outliers: a share ``outlier_rate`` of the samples runs lo..hi times longer than its group's median."""
    base = dict(prompts=40, group_size=8, epochs=1, mean_len=50, vocab=100, max_len=100000, sample_length_sigma=0.05)
    cfg = SynthConfig(**base, outlier_rate=rate, outlier_min_scale=lo, outlier_max_scale=hi, seed=2)
    lengths = [len(r.response) for r in generate(cfg)]
    groups = [sorted(lengths[g : g + 8]) for g in range(0, len(lengths), 8)]
    ratios = [n / ((grp[3] + grp[4]) / 2) for grp in groups for n in grp]
    stretched = [x for x in ratios if x > 2.0]
    assert share[0] <= len(stretched) / len(ratios) <= share[1]
    assert all(0.8 * lo <= x <= 1.2 * hi for x in stretched)
    if rate == 0:  # the default trace is unchanged by the feature
        same = SynthConfig(**base, outlier_rate=0.0, outlier_min_scale=7.0, outlier_max_scale=7.0, seed=2)
        assert lengths == [len(r.response) for r in generate(same)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("prompts", 0), ("drift", 1.5), ("max_len", 1), ("steps_per_epoch", 100), ("vocab", 3), ("outlier_rate", 2.0),
     ("outlier_min_scale", 0.5)],
)  # fmt: skip
def test_synth_config_validation(field, value):
    with pytest.raises(ValueError, match=field):
        SynthConfig(**{field: value})
