"""Imports point down (docs/architecture.md): every import of the package, lazy ones included, goes to a lower layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RANK = {
    "drafting": 0,
    "pipe": 1,
    "tasks": 1,
    "models": 2,
    "engine": 2,
    "plugin": 2,
    "trace": 3,
    "server": 3,
    "replay": 4,
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


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """Every module's imports of our modules (lazy ones included), and each ``from P import name`` by a submodule
    of package ``P`` where ``name`` is not a submodule (it reads ``P/__init__.py``, which imports the submodule).

    A ``from P import x`` names module ``P.x`` when ``P/x.py``, ``P/x/`` or a built ``P/x.*.so`` exists, else ``P``.
    The top package is exempt from the second list: its ``__init__`` holds only ``__version__`` and imports nothing.
    """
    files = sorted((root / "sglang_histospec").rglob("*.py")) + sorted((root / "trl_integration").rglob("*.py"))
    paths = {_module_name(p, root): p for p in files}

    def is_module(name: str) -> bool:
        stem = root.joinpath(*name.split("."))
        return name in paths or any(stem.parent.glob(f"{stem.name}.*.so"))

    def module_of(name: str) -> str | None:
        while name and not is_module(name):
            name = name.rpartition(".")[0]
        return name or None

    graph, own = {}, []
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    targets.add(sub if is_module(sub) else node.module)
                    if not is_module(sub) and node.module == package not in (name, "sglang_histospec"):
                        own.append(f"{path.relative_to(root)}:{node.lineno}: imports {a.name} from {package}")
        graph[name] = {m for t in targets if (m := module_of(t)) not in (None, name)}
    return graph, own


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    assert _cycles(_import_graph()[0]) == []


def test_no_submodule_reads_its_own_package_init():
    assert _import_graph()[1] == []


CHECKER_CASES = [  # (files under sglang_histospec/, cycles, own-package reads)
    ({"a/__init__.py": "", "a/x.py": "from sglang_histospec.a import y\n", "a/y.py": ""}, [], []),
    (
        {
            "a/__init__.py": "",
            "a/x.py": "def f():\n    import sglang_histospec.a.y\n",
            "a/y.py": "import sglang_histospec.a.x\n",
        },
        [["sglang_histospec.a.x", "sglang_histospec.a.y"]],
        [],
    ),
    (
        {
            "a/__init__.py": "from sglang_histospec.a.x import f\nK = 1\n",
            "a/x.py": "from sglang_histospec.a import K\n",
        },
        [["sglang_histospec.a", "sglang_histospec.a.x"]],
        ["sglang_histospec/a/x.py:1: imports K from sglang_histospec.a"],
    ),
]


@pytest.mark.parametrize("files, cycles, own", CHECKER_CASES)
def test_the_checker_sees_cycles_and_own_package_reads(tmp_path, files, cycles, own):
    for rel, text in files.items():
        path = tmp_path / "sglang_histospec" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "sglang_histospec" / "__init__.py").write_text("")
    graph, reads = _import_graph(tmp_path)
    assert (_cycles(graph), reads) == (cycles, own)


def test_the_engine_stages_import_down():
    """Within the engine, the draft-size policy and the selector sit below the commit stage and the engine loop:
    neither imports them (the selector gets ``tell_drafter`` from ``engine/request.py``)."""
    graph = _import_graph()[0]
    upper = {"sglang_histospec.engine.commit", "sglang_histospec.engine.engine"}
    for low in ("sglang_histospec.engine.policy", "sglang_histospec.engine.selector"):
        assert graph[low] & upper == set(), low
    assert "sglang_histospec.engine.selector" not in graph["sglang_histospec.engine.policy"]
