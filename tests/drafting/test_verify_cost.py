"""The verify-cost table's absolute pass times (``pass_ms``), the ``ms`` file format and the default model."""

from __future__ import annotations

import pytest

from sglang_histospec.drafting.verify_cost import VerifyCostTable

MS = {"ms": {"1": {"1": 2.0, "3": 3.0}, "9": {"1": 4.0, "2": 6.0}}, "label": "measured x", "meta": {"measured": True}}


@pytest.mark.parametrize(
    ("k", "b", "want"),
    [
        (1, 1, 2.0),  # a listed cell
        (2, 1, 2.5),  # linear in k
        (1, 5, 3.0),  # linear in b between the listed batches
        (2, 9, 6.0),
        (1.5, 9, 5.0),  # fractional rows: a ragged tree batch
        (1, 17, 6.0),  # past the largest batch: extrapolated from the two nearest
        (4, 9, 10.0),  # past the largest k: from the row's last two points
    ],
)
def test_pass_ms_interpolates(k, b, want):
    assert VerifyCostTable.from_dict(MS).pass_ms(k, b) == pytest.approx(want)


def test_ms_file_derives_relative_costs_and_round_trips():
    t = VerifyCostTable.from_dict(MS)
    assert t.measured and t.label == "measured x"
    assert t.cost(3, 1) == pytest.approx(1.5) and t.cost(2, 9) == pytest.approx(1.5)
    again = VerifyCostTable.from_dict(t.to_dict())
    assert again.pass_ms(2, 5) == t.pass_ms(2, 5) and again.meta == {"measured": True}


def test_default_is_a_labelled_model_with_the_relative_roofline():
    d = VerifyCostTable.default()
    assert not d.measured and "MODEL" in d.label
    for k, b in ((1, 1), (9, 1), (9, 64), (17, 256)):
        roofline = max(1 + 0.01 * (k - 1), b * k / 256) / max(1, b / 256)
        assert d.cost(k, b) == pytest.approx(roofline)
        assert d.pass_ms(k, b) == pytest.approx(4.8 * max(1 + 0.01 * (k - 1), b * k / 256))


@pytest.mark.parametrize(
    ("table", "match"),
    [({"batches": {"1": {"1": 1.0}}}, "no absolute pass times"), (MS, "must be >= 1")],
)
def test_pass_ms_refuses(table, match):
    t = VerifyCostTable.from_dict(table)
    with pytest.raises(ValueError, match=match):
        t.pass_ms(0 if "ms" in table else 1, 1)


def test_bad_meta_is_refused():
    with pytest.raises(ValueError, match="meta"):
        VerifyCostTable.from_dict({**MS, "meta": [1]})
