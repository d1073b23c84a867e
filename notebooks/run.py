"""Execute the notebooks with this interpreter's kernel (``make notebooks``, ``tests/test_notebooks.py``).

The kernel is this Python (``sys.executable``, e.g. ``.venv/bin/python``) through a kernelspec written to a
temporary directory, so nothing has to be installed with ``jupyter kernelspec`` first. Executed copies go to
``--out`` (default ``build/notebooks``); the committed notebooks stay stripped (``--strip`` strips them).

Examples::

    .venv/bin/python notebooks/run.py                       # all notebooks, full configurations
    .venv/bin/python notebooks/run.py --small 02_drafters   # one notebook, CI configuration
    .venv/bin/python notebooks/run.py --trace run.jsonl.gz  # on your own trace
    .venv/bin/python notebooks/run.py --strip               # remove outputs from the committed notebooks
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent
KERNEL_NAME = "histospec-python"


def notebooks(names: list[str] | None = None) -> list[Path]:
    """The notebooks of this directory (``NN_name.ipynb``), or those whose stem starts with one of ``names``."""
    all_nbs = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return all_nbs
    picked = [p for p in all_nbs if any(p.stem.startswith(n.removesuffix(".ipynb")) for n in names)]
    if not picked:
        raise ValueError(f"no notebook matches {names}; known: {[p.stem for p in all_nbs]}")
    return picked


def execute(path: Path, env: dict[str, str] | None = None, timeout: int = 600):  # noqa: ANN201 (NotebookNode)
    """Run ``path`` top to bottom in a fresh kernel of ``sys.executable``; returns the executed notebook.

    ``env`` is added to this process's environment for the kernel (e.g. ``HISTOSPEC_NB_SMALL=1``). Raises
    ``nbclient.exceptions.CellExecutionError`` naming the failing cell.
    """
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="histospec-kernel-") as tmp:
        spec_dir = Path(tmp) / "kernels" / KERNEL_NAME
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python ({sys.executable})",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        ksm = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
        km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=ksm)
        client = NotebookClient(
            nb, km=km, timeout=timeout, kernel_name=KERNEL_NAME, resources={"metadata": {"path": str(path.parent)}}
        )
        client.execute(env={**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline", **(env or {})})
    return nb


def strip(path: Path) -> bool:
    """Remove outputs, execution counts and run metadata from ``path`` in place; True when it changed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    after = nbformat.writes(nb)
    if after != before:
        path.write_text(after)
    return after != before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebooks to run (prefixes such as 01 or 03_histopipe); default all")
    ap.add_argument("--small", action="store_true", help="small configurations (what CI runs)")
    ap.add_argument("--trace", default=None, help="run on this trace instead of the demo's / a synthetic one")
    ap.add_argument("--out", default="build/notebooks", help="where the executed copies are written")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    ap.add_argument("--strip", action="store_true", help="strip the outputs of the committed notebooks and exit")
    args = ap.parse_args(argv)
    paths = notebooks(args.names)
    if args.strip:
        for p in paths:
            print(f"{p.name}: {'stripped' if strip(p) else 'already clean'}")
        return 0
    import nbformat

    env = {"HISTOSPEC_NB_SMALL": "1" if args.small else "0"}
    if args.trace:
        env["HISTOSPEC_NB_TRACE"] = os.path.abspath(args.trace)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for p in paths:
        t0 = time.perf_counter()
        nb = execute(p, env, args.timeout)
        nbformat.write(nb, out / p.name)
        print(f"{p.name}: ok in {time.perf_counter() - t0:.1f} s -> {out / p.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
