"""Imports point down (docs/architecture.md): every import of the package, lazy ones included, goes to a lower layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RANK = {
    "drafting": 0,
    "pipe": 1,
    "trace": 1,
    "replay": 2,
    "models": 2,
    "engine": 2,
    "plugin": 2,
    "server": 3,
    "router": 4,
    "trl_integration": 5,
    "demo": 6,
    "commands": 7,
    "cli": 8,
}
"""The layers of docs/architecture.md; a package may import only packages of lower rank (and itself)."""


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "trl_integration":
        return "trl_integration"
    if parts[0] != "sglang_histospec" or len(parts) == 1:
        return None
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _violations(root: Path = ROOT) -> list[str]:
    bad = []
    files = sorted((root / "sglang_histospec").rglob("*.py")) + sorted((root / "trl_integration").rglob("*.py"))
    for path in files:
        rel = path.relative_to(root)
        src = _layer(".".join(rel.with_suffix("").parts))
        for lineno, module in _imports(path):
            dst = _layer(module)
            if dst is None or dst == src or dst not in RANK:
                continue  # not ours, the same package, or a name of the top package (``__version__``)
            if src not in RANK or dst not in RANK or RANK[dst] >= RANK[src]:
                bad.append(f"{rel}:{lineno}: {src} imports {module} ({dst})")
    return bad


def test_every_package_has_a_layer():
    packages = {p.name for p in (ROOT / "sglang_histospec").iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in (ROOT / "sglang_histospec").glob("*.py") if p.stem != "__init__"}
    assert packages | modules <= set(RANK), "add the new package to RANK and the doc"


def test_imports_point_down():
    assert _violations() == []


def test_the_checker_sees_an_upward_import(tmp_path):
    pkg = tmp_path / "sglang_histospec" / "drafting"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text("def f():\n    from sglang_histospec.server.app import build_app\n")
    assert _violations(tmp_path) == [
        "sglang_histospec/drafting/bad.py:2: drafting imports sglang_histospec.server.app.build_app (server)"
    ]


def test_the_doc_names_every_layer():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for name in RANK:
        assert f"{name}/" in text or f"{name}.py" in text, name


def test_the_doc_names_existing_modules():
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:sglang_histospec/|trl_integration/)?[a-z_]+(?:/[a-z_]+)*\.py)", text))
    missing = [p for p in named if not (ROOT / p).exists() and not (ROOT / "sglang_histospec" / p).exists()]
    assert named and missing == []
