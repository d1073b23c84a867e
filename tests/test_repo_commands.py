"""The README's test command is CI's: `.ci/run` lints, then runs `make test`, and `make test` installs what it needs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(script: str) -> list[str]:
    lines = (line.strip() for line in script.splitlines())
    return [line for line in lines if line and not line.startswith("#") and not line.startswith(("set ", "cd "))]


def test_ci_runs_the_readme_test_command_and_nothing_that_changes_it():
    assert _commands((ROOT / ".ci" / "run").read_text()) == ["make lint", "make test"]
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^make test\b", quick_start, re.M), "the README's quick start must give `make test`"


def test_make_test_installs_the_sglang_harness_itself():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test:(.*)$", makefile, re.M)
    assert target is not None and "install-sglang" in target.group(1).split()
