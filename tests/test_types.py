import pytest

from sglang_histospec.drafting import ROOT, Draft


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
