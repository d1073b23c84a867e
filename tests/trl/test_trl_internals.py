"""TRL's private API, used only through ``trl_integration/trl_internals.py``, still matches the pinned TRL 1.16.0.

A TRL upgrade that renames or re-signs any private method we override, call or stand in for fails here, naming it.
No server or model needed.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import trl  # noqa: F401  (a hard test dependency: `make test` installs it; missing, it must fail)

from trl_integration import trl_internals
from trl_integration.trainer import HistoSpecGRPOTrainer

PACKAGE = Path(trl_internals.__file__).parent


def test_the_pinned_trl_has_every_private_name_we_rely_on():
    assert trl_internals.check_pinned_trl() == []


def test_a_changed_signature_is_reported_by_name(monkeypatch):
    name = "trl.GRPOTrainer._calculate_rewards"
    monkeypatch.setitem(trl_internals.PRIVATE_METHODS, name, ["self", "inputs"])
    [problem] = trl_internals.check_pinned_trl()
    assert problem.startswith(f"{name}: parameters ['self', 'inputs', 'prompts'")


def test_the_only_private_override_is_the_reward_hook():
    """HistoSpecGRPOTrainer overrides no private method of GRPOTrainer itself; RewardHook's are all pinned."""
    from trl import GRPOTrainer

    own = {n for n in vars(HistoSpecGRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    assert not own & set(dir(GRPOTrainer))
    hooked = {n for n in vars(trl_internals.RewardHook) if n.startswith("_") and not n.startswith("__")}
    assert {f"trl.GRPOTrainer.{n}" for n in hooked} <= set(trl_internals.PRIVATE_METHODS)
    assert HistoSpecGRPOTrainer.__mro__.index(trl_internals.RewardHook) < HistoSpecGRPOTrainer.__mro__.index(
        GRPOTrainer
    )


def test_no_other_module_touches_trls_private_attributes():
    """``self._x`` / ``trainer._x`` where TRL's GRPOTrainer has an ``_x``: only in trl_internals.py."""
    import trl.trainer.grpo_trainer as grpo

    trl_private = set(re.findall(r"self\.(_[a-z]\w*)", inspect.getsource(grpo)))
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "trl_internals.py":
            continue
        used = set(re.findall(r"\b(?:self|trainer)\.(_[a-z]\w*)", path.read_text()))
        assert not used & trl_private, f"{path.name} uses TRL's private {sorted(used & trl_private)}"
