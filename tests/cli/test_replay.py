"""CLI: histospec trace synth / trace stats / replay, JSON on the last line, documented errors."""

from __future__ import annotations

import json

import pytest

from sglang_histospec.cli import main

REPLAY_KEYS = {
    "drafter", "budget", "responses", "tokens", "verify_steps", "tau", "drafted", "accepted", "accept_rate",
    "oracle_tau", "draft_us_p50", "draft_us_p99", "est_speedup", "schedule", "max_running", "peer_reset",
}  # fmt: skip


def last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "synth.jsonl.gz"
    args = ["trace", "synth", str(path), "--prompts", "5", "--group-size", "3", "--epochs", "3", "--mean-len", "40"]
    assert main([*args, "--vocab", "300", "--seed", "2", "--json"]) == 0
    return path


def test_synth_and_stats(trace, capsys, tmp_path):
    capsys.readouterr()
    assert main(["trace", "stats", str(trace), "--min-match", "3", "--json", "--plot", str(tmp_path / "plots")]) == 0
    out = last_json(capsys)
    assert out["epochs"] == 3 and len(out["pairs"]) == 2
    for key in ("token_reuse", "spearman", "kendall", "rank_moved_share"):
        assert key in out and all(key in p for p in out["pairs"])
    assert (tmp_path / "plots" / "token_reuse.png").stat().st_size > 0


@pytest.mark.parametrize(
    "extra",
    [
        ["--drafter", "none"],
        ["--drafter", "prompt-lookup", "--pl-min", "2", "--pl-max", "3"],
        ["--drafter", "histospec", "--chain", "--window", "2", "--sources", "history,self", "--aimd", "paper"],
        ["--drafter", "rhymerl", "--per-step"],
        ["--drafter", "histospec", "--schedule", "sequential"],
        ["--drafter", "histospec", "--max-running", "4"],
    ],
)
def test_replay_json(trace, capsys, tmp_path, extra):
    capsys.readouterr()
    assert main(["replay", str(trace), "--budget", "6", "--json", "--no-progress", *extra]) == 0
    out = last_json(capsys)
    assert set(out) >= REPLAY_KEYS
    assert out["oracle_tau"] >= out["tau"] >= 1.0
    assert out["responses"] == 45 and out["trace_sorted"] is True
    assert ("per_step" in out) == ("--per-step" in extra)
    schedule = "sequential" if "sequential" in extra else "lockstep"
    width = 1 if schedule == "sequential" else (4 if "--max-running" in extra else None)
    assert (out["schedule"], out["max_running"], out["peer_reset"]) == (schedule, width, "never")


def test_replay_plot_and_verify_cost(trace, capsys, tmp_path):
    table = tmp_path / "cost.json"
    table.write_text(json.dumps({"batches": {"1": {"1": 1.0, "7": 1.0}}}))  # free verification
    png = tmp_path / "r.png"
    args = ["replay", str(trace), "--drafter", "histospec", "--budget", "6", "--json", "--no-progress"]
    assert main([*args, "--verify-cost", str(table), "--plot", str(png)]) == 0
    out = last_json(capsys)
    assert out["est_speedup"] == pytest.approx(out["tau"])  # cost 1 per verify step: speedup == tau
    assert png.stat().st_size > 0


PROJECTION_KEYS = {"table", "measured", "host_speed", "policy", "plain_ms", "ms", "pass_ms", "host_ms", "speedup",
                   "tail_share", "plain_tail_share", "rounds", "plain_rounds"}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "label"),
    [
        ([], "roofline MODEL"),
        (["--policy", "adaptive", "--host-speed", "3", "--per-step"], "roofline MODEL"),
        (["--verify-cost", "MS"], "unit"),
        (["--compare", "none"], "roofline MODEL"),
    ],
)
def test_replay_projection(trace, capsys, tmp_path, extra, label):
    table = tmp_path / "ms.json"
    table.write_text(json.dumps({"ms": {"1": {"1": 1.0, "8": 1.0}, "64": {"1": 1.0, "8": 1.0}}, "label": "unit"}))
    extra = [str(table) if x == "MS" else x for x in extra]
    args = ["replay", str(trace), "--drafter", "histospec", "--budget", "6", "--json", "--no-progress"]
    assert main([*args, *extra]) == 0
    proj = last_json(capsys)["projection"]
    assert set(proj) >= PROJECTION_KEYS and proj["table"].startswith(label) and proj["measured"] is False
    assert proj["ms"] == pytest.approx(proj["pass_ms"] + proj["host_ms"], abs=1e-2)
    assert proj["plain_ms"] > 0 and 0 <= proj["tail_share"] <= 1
    assert ("cut" in proj) == ("adaptive" in extra) and ("per_step" in proj) == ("--per-step" in extra)
    if "--compare" in extra:  # plain decoding through the replay: the plain projection, and the ratio to it
        vs = proj["vs"]["none"]
        assert vs["pass_ms"] == pytest.approx(proj["plain_ms"], rel=1e-6) and vs["ratio"] == pytest.approx(
            vs["ms"] / proj["ms"], rel=1e-3
        )
    if label == "unit":  # every pass costs 1 ms: the passes are the rounds, fewer than plain's
        assert proj["pass_ms"] == pytest.approx(proj["rounds"]) and proj["rounds"] < proj["plain_rounds"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--schedule", "sequential", "--policy", "adaptive"], "needs --schedule lockstep"),
        (["--drafter", "prompt-lookup", "--policy", "adaptive"], "calibrated probabilities"),
        (["--host-speed", "0"], "host-speed"),
        (["--verify-cost", "REL", "--compare", "none"], "absolute pass times"),
    ],
)
def test_replay_projection_errors(trace, capsys, tmp_path, extra, message):
    rel = tmp_path / "rel.json"
    rel.write_text(json.dumps({"batches": {"1": {"1": 1.0, "7": 1.0}}}))
    extra = [str(rel) if x == "REL" else x for x in extra]
    drafter = [] if "--drafter" in extra else ["--drafter", "histospec"]
    assert main(["replay", str(trace), "--budget", "6", "--json", "--no-progress", *drafter, *extra]) == 2
    assert message in capsys.readouterr().err


def test_replay_unsorted_trace_is_replayed_in_step_order(tmp_path, capsys):
    lines = [
        {"step": 1, "prompt_id": "a", "sample": 0, "prompt": [1], "response": [5, 6, 7, 8]},
        {"step": 0, "prompt_id": "a", "sample": 0, "prompt": [1], "response": [5, 6, 7, 8]},
    ]
    path = tmp_path / "u.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["replay", str(path), "--drafter", "histospec", "--budget", "3", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert "not sorted by step" in captured.err and out["trace_sorted"] is False
    assert out["verify_steps"] == 4 + 1  # step 0: one token per step; step 1: the history covers all 4 tokens


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"step": 0, "prompt_id": "a", "sample": 0, "prompt": [1], "response": [2]}\n{"step": 0}\n', ":2: field"),
        ("oops\n", ":1: not valid JSON"),
    ],
)
def test_malformed_trace_errors(tmp_path, capsys, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert main(["replay", str(path), "--drafter", "none", "--budget", "2"]) == 2
    assert fragment in capsys.readouterr().err
    assert main(["trace", "stats", str(path)]) == 2
    assert fragment in capsys.readouterr().err


def test_bad_budget_and_synth_config(tmp_path, capsys, trace):
    assert main(["replay", str(trace), "--drafter", "none", "--budget", "-1"]) == 2
    assert "budget" in capsys.readouterr().err
    assert main(["trace", "synth", str(tmp_path / "x.jsonl"), "--drift", "2"]) == 2
    assert "drift" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--drafter", "histospec", "--peer-reset", "step"], "applies to the peers"),
        (["--drafter", "none", "--schedule", "sequential", "--max-running", "2"], "needs schedule='lockstep'"),
        (["--drafter", "none", "--max-running", "0"], "max_running=0"),
    ],
)
def test_replay_refuses_bad_schedule_and_peer_reset(trace, capsys, extra, fragment):
    assert main(["replay", str(trace), "--budget", "4", "--no-progress", *extra]) == 2
    assert fragment in capsys.readouterr().err
