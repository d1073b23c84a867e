"""Shared pytest fixtures.

Example: a module of tiny-model torch tests runs on one CPU thread with
``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
"""

from __future__ import annotations

import pytest

from tests.engine_tools import torch_threads


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one CPU thread for the whole module (see ``tests.engine_tools.torch_threads``)."""
    with torch_threads(1):
        yield
