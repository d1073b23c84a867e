import pytest

from sglang_histospec.drafting import ROOT, Draft
from sglang_histospec.drafting.types import accepted_length, accepted_path, tau
from sglang_histospec.server.metrics import ServerCounters


@pytest.mark.parametrize(
    "draft, depths, error",
    [
        (Draft(), [], None),
        (Draft([5, 7, 6], [ROOT, ROOT, 0], [0.6, 0.4, 0.6]), [1, 1, 2], None),
        (Draft([5, 6], [ROOT, 1], [1.0, 1.0]), None, "not ROOT and not an earlier node"),
        (Draft([5, 6, 7], [ROOT, 0, ROOT], [1.0, 1.0, 1.0]), None, "BFS order"),
        (Draft([5], [], [1.0]), None, "length mismatch"),
    ],
)
def test_draft_invariants(draft, depths, error):
    problem = draft.check()
    if error is None:
        assert problem is None
        assert draft.depths() == depths
    else:
        assert error in problem


def test_path_and_empty():
    d = Draft([5, 7, 6], [ROOT, ROOT, 0], [0.6, 0.4, 0.6])
    assert d.path(2) == [5, 6] and d.path(1) == [7]
    assert len(Draft.empty()) == 0 and Draft.empty().source == ""


def test_tau_is_zero_before_any_verify_step():
    assert tau(12, 4) == 3.0 and tau(0, 0) == 0.0
    assert ServerCounters().tau() == 0.0  # every tau in the package uses the same empty case


@pytest.mark.parametrize(
    "target, start, path",
    [([5, 6, 9], 0, [0, 2]), ([7, 6], 0, [1]), ([1, 5, 6], 1, [0, 2]), ([5, 6], 2, []), ([9], 0, [])],
)
def test_accepted_path_walks_the_first_matching_child(target, start, path):
    # root -> 5 -> 6 and root -> 7; a second 5 under the root is never reached (the first 5 wins)
    tokens, parents = [5, 7, 6, 5], [ROOT, ROOT, 0, ROOT]
    assert accepted_path(tokens, parents, target, start) == path
    assert accepted_length(tokens, parents, target, start) == len(path)
