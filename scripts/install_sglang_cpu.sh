#!/usr/bin/env bash
# Install sglang==0.5.23 for CPU tests into a separate venv (default .venv-sglang), without a CUDA torch.
#
# SGLang's wheel hard-pins a CUDA torch and CUDA kernel packages, so it is installed with --no-deps plus its
# ordinary Python requirements (tests/sglang_harness/requirements-cpu.txt), torch pinned to the 2.13.0 CPU wheel,
# and torchvision 0.28.0 (a CUDA build on PyPI) patched so that `import torchvision.transforms` works without its
# C++ ops. sglang_histospec is linked into the venv (a .pth to the checkout plus a metadata-only dist-info that
# declares the `sglang.srt.plugins` entry point), so the native extension is not rebuilt. Details: docs/sglang.md.
#
# With TORCH_FROM=OTHER_VENV (the Makefile passes the project's .venv), torch 2.13.0 CPU is linked from that venv's
# site-packages instead of installed a second time (about 0.75 GB less on disk); the other venv must stay.
#
# Usage: [TORCH_FROM=VENV0] scripts/install_sglang_cpu.sh [VENV]   (writes VENV/.installed, VENV/.install-seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${1:-.venv-sglang}
PY=$VENV/bin/python
PIP="$PY -m pip"
PIN=$(mktemp)
trap 'rm -f "$PIN"' EXIT
printf 'torch==2.13.0\n' >"$PIN"
start=$(date +%s)
step() { echo "[install-sglang] $(($(date +%s) - start))s: $*"; }

rm -f "$VENV/.installed"
test -x "$PY" || python3 -m venv "$VENV"
step "pip"
$PIP install -q -U pip
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -n "${TORCH_FROM:-}" ] && { [ ! -e "$SITE/torch" ] || [ -L "$SITE/torch" ]; }; then
    FROM=$("$TORCH_FROM/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    step "torch 2.13.0 (CPU wheel) linked from $FROM"
    DIST=$(cd "$FROM" && ls -d torch-2.13.0*.dist-info)  # fails (set -e) when TORCH_FROM has no torch 2.13.0
    for name in torch torchgen functorch "$DIST"; do
        test -e "$FROM/$name" || { echo "install-sglang: $FROM/$name missing: make install first" >&2; exit 1; }
        ln -sfn "$FROM/$name" "$SITE/$name"
    done
    $PIP install -q -c "$PIN" torch==2.13.0  # torch's own dependencies (sympy, networkx, ...) into this venv
else
    step "torch 2.13.0 (CPU wheel)"
    $PIP install -q -c "$PIN" torch==2.13.0
fi
$PY - <<'PY'
import torch, sys
if "+cpu" not in torch.__version__ and torch.version.cuda is not None:
    sys.exit(f"install-sglang: expected the CPU build of torch 2.13.0, got {torch.__version__} (CUDA {torch.version.cuda})")
PY
step "sglang 0.5.23 (--no-deps)"
$PIP install -q --no-deps sglang==0.5.23
step "sglang's pure-Python requirements"
$PIP install -q -c "$PIN" -r tests/sglang_harness/requirements-cpu.txt
step "torchvision 0.28.0 (--no-deps) + guard for its missing C++ ops"
$PIP install -q --no-deps torchvision==0.28.0
$PY - <<'PY'
import pathlib, sysconfig
init = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchvision" / "__init__.py"
text = init.read_text()
old = "from torchvision import (\n    _autograd_registrations,\n    _meta_registrations,\n"
new = (
    "if extension._has_ops():  # histospec-cpu-guard: the PyPI wheel's C++ ops need CUDA\n"
    "    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401\n"
    "from torchvision import (\n"
)
if "histospec-cpu-guard" not in text:
    if old not in text:
        raise SystemExit(f"install-sglang: unexpected {init}: cannot find the registrations import to guard")
    init.write_text(text.replace(old, new, 1))
PY
step "link sglang_histospec (no rebuild of the native extension)"
$PY - "$ROOT" <<'PY'
import pathlib, sys, sysconfig, tomllib
root = pathlib.Path(sys.argv[1])
site = pathlib.Path(sysconfig.get_paths()["purelib"])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
(site / "sglang_histospec_checkout.pth").write_text(f"{root}\n")
dist = site / f"sglang_histospec-{project['version']}.dist-info"
dist.mkdir(exist_ok=True)
(dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang-histospec\nVersion: {project['version']}\n")
groups = project.get("entry-points", {})
scripts = project.get("scripts", {})
lines = []
if scripts:
    lines += ["[console_scripts]"] + [f"{k} = {v}" for k, v in scripts.items()] + [""]
for group, eps in groups.items():
    lines += [f"[{group}]"] + [f"{k} = {v}" for k, v in eps.items()] + [""]
(dist / "entry_points.txt").write_text("\n".join(lines))
(dist / "INSTALLER").write_text("install_sglang_cpu.sh\n")
(dist / "RECORD").write_text("")
PY
step "import check"
SGLANG_USE_CPU_ENGINE=0 $PY -c "import sglang, torch, torchvision.transforms, sglang_histospec; print('sglang', sglang.__version__, 'torch', torch.__version__)"
end=$(date +%s)
echo $((end - start)) >"$VENV/.install-seconds"
touch "$VENV/.installed"
step "done in $((end - start)) s"
