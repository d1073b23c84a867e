"""Test-only start-up hook for SGLang server processes launched by tests/sglang_harness (never product code).

SGLang's ``torch_native`` attention backend (the CPU fallback without AMX) cannot verify a draft tree
(TARGET_VERIFY: prefix plus tree mask). When ``HISTOSPEC_SGLANG_TEST_HARNESS=1`` this hook waits for that module to
be imported in any SGLang process and wraps ``TorchNativeAttnBackend.forward_extend`` with
``histospec_target_verify.forward_extend_with_target_verify``; other forward modes are left untouched.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

_TARGET = "sglang.srt.layers.attention.torch_native_backend"


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module):
            original_exec(module)
            import histospec_target_verify

            histospec_target_verify.install(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HISTOSPEC_SGLANG_TEST_HARNESS") == "1":
    sys.meta_path.insert(0, _PatchAfterImport())
