"""Build the native history index (C++17, pybind11) as ``sglang_histospec.drafting._native``.

Everything else is declared in pyproject.toml. The extension is built with the machine's compiler; there is
no network access and no GPU at build time.
"""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ext_modules = [
    Pybind11Extension(
        "sglang_histospec.drafting._native",
        sorted(
            ["csrc/anchors.cc", "csrc/bindings.cc", "csrc/drafter.cc", "csrc/index.cc", "csrc/pool.cc", "csrc/sais.cc"]
        ),
        cxx_std=17,
        # -ffp-contract=off: no fused multiply-adds, so that doubles round as in the Python references
        extra_compile_args=["-O3", "-g", "-ffp-contract=off", "-pthread"],
        extra_link_args=["-pthread"],  # draft_threads: the drafters' thread pools (csrc/pool.h)
    ),
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
