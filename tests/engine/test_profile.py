"""The engine's start-up profile: its design points, the timed passes, and a cut that is in force at once."""

from __future__ import annotations

import pytest

from sglang_histospec.engine import EngineConfig
from sglang_histospec.engine.engine import Engine
from sglang_histospec.engine.profile import design_points, profile_verify, verify_pass
from tests.helpers.engine_tools import torch_threads
from tests.helpers.tiny import make_tiny_model_dir


@pytest.mark.parametrize(
    "max_batch, extra, expected",
    [
        (1, 16, [(1, 0), (1, 16)]),
        (4, 16, [(1, 0), (1, 16), (4, 0), (4, 33)]),
        (64, 16, [(1, 0), (1, 16), (64, 0), (64, 1)]),  # as many extra rows as 8 full drafts, at least 1 each
    ],
)
def test_design_points(max_batch, extra, expected):
    assert design_points(max_batch, extra) == expected


def test_profile_times_every_point_after_a_warm_up(tmp_path):
    with torch_threads(1):
        engine = Engine(EngineConfig(model_path=make_tiny_model_dir(tmp_path / "m"), max_running_requests=4))
        got = profile_verify(engine._fwd, engine._cache, max_batch=4, extra_per_request=8, rounds=2)
    assert [(b, r) for b, r, _ in got] == [
        (1, 1),
        (1, 9),
        (4, 4),
        (4, 4 * 18),
    ] * 2  # 8 full drafts of 9 rows over 4 requests
    assert all(s > 0 for _, _, s in got)
    with pytest.raises(ValueError, match="max_batch=0"):
        profile_verify(engine._fwd, engine._cache, max_batch=0, extra_per_request=8)


@pytest.mark.parametrize("selection, ready", [("adaptive", True), ("always", False)])
def test_the_cut_is_ready_before_the_first_step(tmp_path, selection, ready):
    with torch_threads(1):
        engine = Engine(
            EngineConfig(
                model_path=make_tiny_model_dir(tmp_path / "m"), max_running_requests=8, draft_selection=selection
            )
        )
    assert engine.policy.step_cost.ready is ready
    if ready:
        assert engine.policy.step_cost.row_cost() >= 0.0 and engine.policy.step_cost.base_cost(8) > 0.0


def test_the_profile_leaves_the_cache_as_a_plain_engine_has_it(tmp_path):
    """The dummy passes grow the cache; the profile hands back the storage it had, so that a reserve sizes a
    HistoSpec engine's cache as a plain engine's (a doubled capacity would give the two other memory layouts)."""
    model = make_tiny_model_dir(tmp_path / "m")
    with torch_threads(1):
        engines = [
            Engine(EngineConfig(model_path=model, max_running_requests=8, speculative_algorithm=alg))
            for alg in ("HISTOSPEC", "NONE")
        ]
        assert engines[0].policy.step_cost.ready and [e._cache.capacity for e in engines] == [0, 0]
        for e in engines:
            e.reserve(40)
    assert [(e._cache.slots, e._cache.capacity) for e in engines] == [(8, 64), (8, 64)]


@pytest.mark.parametrize(
    "capacity, batch, extra, context, written",
    [
        (64, 2, 3, 5, range(5, 9)),  # 4 rows after 5 cached keys
        (64, 1, 0, 0, range(0, 1)),
        (8, 3, 2, 40, range(5, 8)),  # the context shrinks to what the capacity leaves
        (4, 1, 9, 0, range(0, 4)),  # and so do the rows
    ],
)
def test_verify_pass_writes_its_rows_after_the_context(tmp_path, capacity, batch, extra, context, written):
    from sglang_histospec.engine.model import TreeForward
    from sglang_histospec.models.shapes import random_model

    with torch_threads(1):
        fwd = TreeForward(random_model("tiny"))
        cache = fwd.new_cache(max_slots=4, max_capacity=capacity)
        cache.ensure(4, capacity)
        verify_pass(fwd, cache, batch, extra, context=context)
    touched = cache.data.abs().sum(dim=(0, 1, 3, 5)) > 0  # [slots, capacity]
    assert touched[:batch].nonzero()[:, 1].unique().tolist() == list(written)
    assert not touched[batch:].any()
