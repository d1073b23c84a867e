"""Fixtures of the SGLang harness tests (marker ``sglang``): the harness check and the tiny model they serve."""

from __future__ import annotations

import pytest

from tests.sglang_harness import require_harness, tiny_model_dir


@pytest.fixture(scope="module")
def sglang_harness() -> None:
    """Skips the module without ``.venv-sglang`` (fails under CI); use with ``pytest.mark.usefixtures``."""
    require_harness()


@pytest.fixture(scope="module")
def sglang_model_dir(tmp_path_factory) -> str:
    """The tiny random Llama (vocab 64) the SGLang servers of a module serve."""
    return tiny_model_dir(tmp_path_factory.mktemp("sglang-model"))
