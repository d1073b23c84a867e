"""``Drafter`` (drafting/protocol.py): the drafters the engine, the plugin and the replay drive provide all of it,
with the Protocol's parameter names, and a request's life through it drafts from pushed history."""

from __future__ import annotations

import inspect

import pytest

from sglang_histospec.drafting import Draft, DraftCalibration, Drafter, HistoSpecDrafter
from tests.helpers.engine_tools import ScriptedDrafter

METHODS = [name for name, value in vars(Drafter).items() if inspect.isfunction(value) and not name.startswith("_")]

IMPLEMENTATIONS = [  # (name, factory)
    ("HistoSpecDrafter", lambda: HistoSpecDrafter()),
    ("ScriptedDrafter", lambda: ScriptedDrafter({"p": [1, 2]})),
]


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.mark.parametrize("name, make", IMPLEMENTATIONS)
def test_implements_every_member_with_the_protocols_parameters(name, make):
    drafter = make()
    assert isinstance(drafter.calibration, DraftCalibration)
    assert isinstance(drafter.open_step, int)
    assert len(METHODS) == 9
    for method in METHODS:
        assert _params(getattr(type(drafter), method)) == _params(getattr(Drafter, method)), (name, method)


@pytest.mark.parametrize("name, make", IMPLEMENTATIONS)
def test_a_request_drafts_through_the_protocol(name, make):
    drafter: Drafter = make()
    drafter.add("p", 0, [[7, 1, 2, 3]])
    drafter.end_step(0)
    assert drafter.open_step == 1
    drafter.start("r", "p", [5, 7])
    drafter.extend_batch(["r"], [[]])
    (draft,) = drafter.draft_batch(["r"], [2])
    assert isinstance(draft, Draft) and draft.token_ids == [1, 2]
    drafter.finish("r", [1, 2])
    assert isinstance(drafter.stats(), dict)
