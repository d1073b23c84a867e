"""Size limits of the package (issue 43): no module over ``MAX_MODULE_LINES`` lines, no function over
``MAX_FUNCTION_LINES`` (from its ``def`` line to its last line, docstring included), except those listed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
EXCEPTIONS: dict[str, int] = {}
"""``path`` or ``path::function`` -> its allowed lines, for what cannot be split yet (none today)."""


def _oversized(root: Path = ROOT) -> list[str]:
    """``path: N lines`` and ``path::function: N lines`` of everything over its limit and not in EXCEPTIONS."""
    bad = []
    files = sorted((root / "sglang_histospec").rglob("*.py")) + sorted((root / "trl_integration").rglob("*.py"))
    for path in files:
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > EXCEPTIONS.get(rel, MAX_MODULE_LINES):
            bad.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > EXCEPTIONS.get(f"{rel}::{node.name}", MAX_FUNCTION_LINES):
                    bad.append(f"{rel}::{node.name}: {n} lines")
    return bad


def test_no_module_or_function_over_its_limit():
    assert _oversized() == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f():\n    return 1\n", []),
        ("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES, ["sglang_histospec/m.py::f: 81 lines"]),
        ("x = 1\n" * (MAX_MODULE_LINES + 1), ["sglang_histospec/m.py: 701 lines"]),
    ],
)
def test_the_checker_sees_an_oversized_module_or_function(tmp_path, source, expected):
    (tmp_path / "sglang_histospec").mkdir()
    (tmp_path / "sglang_histospec" / "m.py").write_text(source)
    assert _oversized(tmp_path) == expected
