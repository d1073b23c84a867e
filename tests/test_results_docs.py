"""README.md and docs/results.md hold what scripts/render_results.py renders from the committed JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _renderer():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "scripts" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


render = _renderer()


@pytest.mark.parametrize("doc", render.DOCS, ids=lambda p: p.name)
def test_doc_matches_rendered_json(doc):
    text = doc.read_text()
    assert render.MARKER.search(text), f"{doc.name} has no results block"
    assert render.render_text(text, doc) == text, f"{doc.name} is stale: run `make results`"


def test_readme_results_table_is_short():
    block = render.render_readme(ROOT / "README.md")
    assert 4 <= block.count("\n") - 1 <= 14  # header and separator lines, then at most about 12 rows


def test_prose_outside_markers_is_kept():
    doc = ROOT / "docs" / "results.md"
    text = "before\n<!-- results:lockstep -->\nold table\n<!-- /results:lockstep -->\nafter\n"
    out = render.render_text(text, doc)
    assert out.startswith("before\n<!-- results:lockstep -->\n") and out.endswith(
        "<!-- /results:lockstep -->\nafter\n"
    )
    assert "old table" not in out


def test_unknown_block_names_the_fix():
    with pytest.raises(ValueError, match="unknown results block 'nope'"):
        render.render_text("<!-- results:nope -->\n<!-- /results:nope -->", ROOT / "README.md")


def test_find_refuses_two_versions_of_one_result(tmp_path):
    for commit in ("aaaaaaa", "bbbbbbb"):
        (tmp_path / f"bench_index_2026-12-06_{commit}.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="keep the newest"):
        render.find("bench_index", tmp_path)
    (tmp_path / "bench_index_2026-12-06_aaaaaaa.jsonl").unlink()
    assert render.find("bench_index", tmp_path).commit == "bbbbbbb"


LOCKSTEP_ROWS = [
    # (schedule, drafter, peer_reset, budget, tau, oracle_tau)
    ("sequential", "histospec", None, 8, 5.0, 7.5),
    ("sequential", "sglang-ngram", "never", 8, 3.8, None),
    ("sequential", "sglang-ngram", "step", 8, 2.9, None),
    ("sequential", "suffix", "never", 8, 3.2, None),
    ("sequential", "rhymerl", None, 8, 2.0, None),
    ("lockstep", "histospec", None, 8, 4.5, 7.0),
    ("lockstep", "sglang-ngram", "step", 8, 2.5, None),
    ("lockstep", "histospec", None, 16, 5.5, 9.0),
    ("lockstep", "prompt-lookup", None, 16, 1.0, None),
]


def _write_lockstep(path: Path, rows) -> None:
    keys = ("schedule", "drafter", "peer_reset", "budget", "tau", "oracle_tau")
    lines = [{**dict(zip(keys, r)), "draft_us_p50": 10.0, "draft_us_p99": 40.0, "commit": "abc1234"} for r in rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_lockstep_tables_one_per_trace(tmp_path):
    seq = [r for r in LOCKSTEP_ROWS if r[0] == "sequential"]
    lock = [r for r in LOCKSTEP_ROWS if r[0] == "lockstep"]
    _write_lockstep(tmp_path / "replay_toy_sequential.jsonl", seq)
    _write_lockstep(tmp_path / "replay_toy_lockstep.jsonl", lock)
    _write_lockstep(tmp_path / "replay_other_lockstep.jsonl", lock[:1])
    out = render.lockstep_tables(tmp_path, tmp_path / "results.md")
    assert out.index("**other**") < out.index("**toy**")
    toy = out[out.index("**toy**") :]
    header = "| schedule | N | histospec | NGRAM same corpus | NGRAM as deployed | suffix | rhymerl | oracle |"
    assert header in toy
    assert "| lockstep | 8 | 4.50 | – | 2.50 | – | – | 7.00 |" in toy
    assert "| lockstep | 16 | 5.50 | – | – | – | – | 9.00 |" in toy
    assert "| sequential | 8 | 5.00 | 3.80 | 2.90 | 3.20 | 2.00 | 7.50 |" in toy
    assert "commit `abc1234`" in toy


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ({"drafter": "sglang-ngram", "peer_reset": "step"}, "NGRAM as deployed"),
        ({"drafter": "sglang-ngram", "peer_reset": "never"}, "NGRAM same corpus"),
        ({"drafter": "sglang-ngram"}, "NGRAM same corpus"),
        ({"drafter": "suffix", "peer_reset": "step"}, None),
        ({"drafter": "histospec"}, "histospec"),
        ({"drafter": "prompt-lookup"}, None),
        ({"drafter": "sglang-ngram", "label": "sglang-ngram@step", "peer_reset": "step"}, "NGRAM as deployed"),
        ({"drafter": "histospec", "label": "histospec[window=2]"}, None),
    ],
)
def test_lockstep_column(row, column):
    assert render.lockstep_column(row) == column


def test_no_lockstep_files_says_so(tmp_path):
    assert render.lockstep_tables(tmp_path, tmp_path / "results.md").startswith("No `replay_")


def test_every_rerun_refreshes_a_committed_result():
    for run in render.RUNS:
        assert "{out}" in run.command
        assert render.find(run.what).path.suffix == f".{run.ext}"
