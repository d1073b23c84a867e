"""The import paths of issue 14's moves keep working for one release: same module objects, a DeprecationWarning."""

import importlib
import sys
import warnings

import pytest

from sglang_histospec._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_path_is_the_new_module(old: str) -> None:
    new = importlib.import_module(f"sglang_histospec.{MOVED[old]}")
    with warnings.catch_warnings():  # the old parent package (sglang_histospec.peers) warns on its own
        warnings.simplefilter("ignore", DeprecationWarning)
        importlib.import_module(f"sglang_histospec.{old.rpartition('.')[0] or 'core'}")
    sys.modules.pop(f"sglang_histospec.{old}", None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        mod = importlib.import_module(f"sglang_histospec.{old}")
    assert mod is new


def test_old_package_exports() -> None:
    from sglang_histospec import drafting
    from sglang_histospec.replay.drafters import PeerUnavailable

    core = importlib.import_module("sglang_histospec.core")
    for name in ("BudgetConfig", "BudgetController", "DrafterConfig", "HistoSpecDrafter", "pack_draft", "ROOT"):
        core.__dict__.pop(name, None)
        with pytest.warns(DeprecationWarning, match=f"drafting.{name}"):
            assert getattr(core, name) is getattr(drafting, name)
    sys.modules.pop("sglang_histospec.peers", None)
    with pytest.warns(DeprecationWarning, match="replay.drafters"):
        peers = importlib.import_module("sglang_histospec.peers")
    assert peers.PeerUnavailable is PeerUnavailable
