"""The notebooks run top to bottom (small configurations), show their figures and print their summary JSON.

Each notebook is executed with nbclient in a fresh kernel of this interpreter (``notebooks/run.py``: a kernelspec
in a temporary directory, nothing to install first). ``HISTOSPEC_DEMO_DIR`` points to an empty directory, so the
notebooks fall back to their small synthetic trace whatever demo runs exist on the machine; one run passes a
user trace instead. The committed notebooks must carry no outputs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import nbformat
import pytest

from sglang_histospec.models import demo_model
from sglang_histospec.tasks.arith import TaskConfig
from sglang_histospec.trace.synth import SynthConfig, write_synthetic
from tests.helpers.demo_tools import TINY

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"


def _load(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(f"histospec_notebooks_{name}", NB_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runner = _load("run")
nbhelpers = _load("nbhelpers")

# A very small demo model: 04_training needs the demo's real output (two runs of the real engine), not its quality.
TINY_DEMO = dataclasses.replace(
    TINY, task=TaskConfig(seed=11, num_prompts=4), train_examples=256, max_steps=10, warmup_steps=2
)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``histospec demo --policy frozen`` writes (summary.json, trace.jsonl.gz), made with the demo's own
    functions on the tiny model: two real runs through the embedded engine, with and without HistoSpec."""
    from sglang_histospec.demo.report import compare_epochs, summary
    from sglang_histospec.demo.rollouts import RolloutConfig, sample_epochs
    from sglang_histospec.tasks.arith import ArithTask

    out = tmp_path_factory.mktemp("demo-out")
    model_dir = demo_model.build_or_load_demo_model(out / "cache", config=TINY_DEMO, progress=False)
    cfg = RolloutConfig(epochs=2, group_size=2, max_new_tokens=24)
    runs = {
        mode: sample_epochs(
            model_dir, ArithTask(TINY_DEMO.task), cfg, mode, out / "trace.jsonl.gz" if mode == "HISTOSPEC" else None,
            progress=False,
        )
        for mode in ("HISTOSPEC", "NONE")
    }  # fmt: skip
    rows = compare_epochs(runs["HISTOSPEC"], runs["NONE"])
    (out / "summary.json").write_text(json.dumps(summary(rows, str(out / "trace.jsonl.gz"), policy="frozen")))
    return out


def _execute(name: str, tmp_path: Path, trace: str = "", demo_dir: Path | None = None, **env: str):  # noqa: ANN202
    (tmp_path / "no-demo").mkdir(exist_ok=True)
    env = {
        "HISTOSPEC_NB_SMALL": "1",
        "HISTOSPEC_NB_TRACE": trace,
        "HISTOSPEC_DEMO_DIR": str(demo_dir or tmp_path / "no-demo"),
        **env,
    }
    (path,) = runner.notebooks([name])
    return runner.execute(path, env, timeout=600)


def _outputs(nb) -> list:  # noqa: ANN001
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _summary(nb) -> dict:  # noqa: ANN001
    """The JSON object on the last line the last code cell printed."""
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.text for o in last.outputs if o.output_type == "stream" and o.name == "stdout")
    return json.loads(text.strip().splitlines()[-1])


def _check_ran(nb) -> None:  # noqa: ANN001
    outs = _outputs(nb)
    assert not [o for o in outs if o.output_type == "error"]
    figures = [o for o in outs if o.output_type == "display_data" and "image/png" in o.data]
    assert figures, "the notebook showed no figure"


def test_committed_notebooks_are_stripped() -> None:
    paths = runner.notebooks()
    assert [p.stem for p in paths] == ["01_history_rhymes", "02_drafters", "03_histopipe", "04_training"][: len(paths)]
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} cell {i} has outputs"
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "TRACE" in tagged[0].source, f"{path.name}: one parameter cell with TRACE"


def test_resolve_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a file"):
        nbhelpers.resolve_trace(str(tmp_path / "missing.jsonl"), small=True, demo_dir=tmp_path)
    path, label = nbhelpers.resolve_trace(None, small=True, demo_dir=tmp_path)  # empty demo dir: synthetic
    assert label.startswith(nbhelpers.SYNTHETIC) and Path(path).is_file()
    demo = tmp_path / "demo" / "run"
    demo.mkdir(parents=True)
    write_synthetic(str(demo / "trace.jsonl.gz"), SynthConfig(prompts=2, group_size=2, epochs=2, vocab=100))
    assert nbhelpers.resolve_trace(None, small=True, demo_dir=tmp_path / "demo") == (
        str(demo / "trace.jsonl.gz"),
        f"demo trace {demo / 'trace.jsonl.gz'}",
    )
    assert nbhelpers.resolve_trace(path, small=True, demo_dir=tmp_path / "demo")[0] == path


def test_01_history_rhymes(tmp_path: Path) -> None:
    nb = _execute("01_history_rhymes", tmp_path)
    _check_ran(nb)
    s = _summary(nb)
    assert s["synthetic"] is True and s["epochs"] == nbhelpers.synthetic_config(True).epochs
    assert s["pairs"] == s["epochs"] - 1
    for key in ("token_reuse", "rank_moved_share"):
        assert 0.0 <= s[key] <= 1.0
    for key in ("spearman", "kendall"):
        assert -1.0 <= s[key] <= 1.0
    reuse = [s["token_reuse_by_min_match"][str(m)] for m in (1, 2, 4, 8)]
    assert reuse == sorted(reuse, reverse=True), "a match of m + 1 tokens contains one of m tokens"


def test_01_on_a_user_trace(tmp_path: Path) -> None:
    trace = tmp_path / "mine.jsonl"
    write_synthetic(str(trace), SynthConfig(prompts=6, group_size=3, epochs=4, mean_len=24, vocab=200, seed=7))
    s = _summary(_execute("01_history_rhymes", tmp_path, trace=str(trace)))
    assert s["trace"] == str(trace) and s["synthetic"] is False
    assert s["epochs"] == 4 and s["pairs"] == 3


def test_02_drafters(tmp_path: Path) -> None:
    nb = _execute("02_drafters", tmp_path)
    _check_ran(nb)
    s = _summary(nb)
    assert s["budgets"] == [2, 8, 32]
    for name in ("histospec", "rhymerl", "prompt-lookup"):
        assert len(s["tau"][name]) == 3 and all(t >= 1.0 for t in s["tau"][name])
    for name in ("histospec", "rhymerl"):  # the oracle bounds every drafter restricted to its sources
        assert all(o >= t for o, t in zip(s["oracle_tau"][name], s["tau"][name]))
    for peer in ("sglang-ngram", "suffix"):  # run when installed, otherwise skipped with a printed note
        assert (peer in s["tau"]) != (peer in s["skipped"])
    printed = "".join(o.get("text", "") for o in _outputs(nb))
    assert all(f"skipped {peer}: not installed" in printed for peer in s["skipped"])


def test_03_histopipe(tmp_path: Path) -> None:
    nb = _execute("03_histopipe", tmp_path)
    _check_ran(nb)
    s = _summary(nb)
    assert s["policies"] == ["round-robin", "lpt", "histopipe"] and s["workers"] == [2, 4, 8]
    rows = s["results"]
    assert {(r["policy"], r["workers"], r["overlap"]) for r in rows} == {
        (p, w, o) for p in s["policies"] for w in s["workers"] for o in (False, True)
    }
    for r in rows:
        assert 0.0 <= r["idle_fraction"] <= 1.0
        assert math.isfinite(r["makespan"]) and r["makespan"] >= r["lower_bound"] * (1 - 1e-9) > 0


def test_04_training_on_the_demo_output(tmp_path: Path, demo_dir: Path) -> None:
    nb = _execute("04_training", tmp_path, demo_dir=demo_dir)
    _check_ran(nb)
    s = _summary(nb)
    demo = json.loads((demo_dir / "summary.json").read_text())
    assert s["mode"] == "demo" and s["needs"] is None and s["synthetic"] is False
    assert s["epochs"] == [0, 1] and s["trace_responses"] == [4 * 2, 4 * 2]
    assert s["reward_histospec"] == [r["reward_histospec"] for r in demo["per_epoch"]]
    assert s["rollout_s_plain"] == [r["rollout_s_plain"] for r in demo["per_epoch"]]
    assert s["trace_matches_summary"] is True  # the trace holds exactly the HistoSpec run's rewarded responses
    assert all(z >= 0 for z in s["reward_z"]) and isinstance(s["rewards_agree"], bool)


def test_04_training_on_a_trace_alone_says_what_it_needs(tmp_path: Path) -> None:
    trace = tmp_path / "mine.jsonl.gz"
    write_synthetic(str(trace), SynthConfig(prompts=5, group_size=2, epochs=3, mean_len=16, vocab=100, seed=3))
    nb = _execute("04_training", tmp_path, trace=str(trace))
    _check_ran(nb)
    s = _summary(nb)
    assert s["mode"] == "trace-only" and s["trace"] == str(trace) and "make demo" in s["needs"]
    assert s["epochs"] == [0, 1, 2] and s["trace_responses"] == [10, 10, 10] and s["rewards_agree"] is None


@pytest.mark.slow
def test_04_training_runs_the_quick_demo_when_its_output_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    nb = _execute("04_training", tmp_path, demo_dir=out, HISTOSPEC_NB_RUN_DEMO="1")
    _check_ran(nb)
    s = _summary(nb)
    assert s["mode"] == "demo" and (out / "summary.json").is_file() and s["trace_matches_summary"] is True
