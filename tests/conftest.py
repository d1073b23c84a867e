"""Shared pytest fixtures.

Example: a module of tiny-model torch tests runs on one CPU thread with
``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
"""

from __future__ import annotations

import os

_ENV_AT_START = dict(os.environ)  # before anything of ours is imported

import pytest  # noqa: E402

from tests.helpers.engine_tools import torch_threads  # noqa: E402

# Set by libraries themselves when imported (torch's inductor picks its cache directory at import).
_SET_BY_LIBRARIES = frozenset({"TORCHINDUCTOR_CACHE_DIR"})


def pytest_collection_finish(session):
    """Fail the run if importing a test module changed the process environment (set it in a fixture instead)."""
    keys = (set(_ENV_AT_START) | set(os.environ)) - _SET_BY_LIBRARIES
    changed = sorted(k for k in keys if _ENV_AT_START.get(k) != os.environ.get(k))
    if changed:
        raise pytest.UsageError(
            f"test collection changed the environment ({', '.join(changed)}): a test module sets it at import; "
            "use monkeypatch.setenv in a fixture or pass env= to the subprocess instead"
        )


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one CPU thread for the whole module (see ``tests.helpers.engine_tools.torch_threads``)."""
    with torch_threads(1):
        yield


@pytest.fixture
def trl_env(monkeypatch):
    """The offline environment of TRL tests (``tests.helpers.trl_harness.ENV``) for one test, undone afterwards."""
    from tests.helpers.trl_harness import ENV

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
