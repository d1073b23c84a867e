"""Budget controller: AIMD policies, batch cap from the verify-cost table, length classes."""

from __future__ import annotations

import pytest

from sglang_histospec.drafting import BudgetConfig, BudgetController

# (config, [(drafted, accepted), ...], budgets after each update)
POLICY_TABLE = [
    ("paper", BudgetConfig.paper(), [(2, 2), (4, 4), (6, 6), (8, 3), (2, 2)], [4, 6, 8, 2, 4]),
    ("paper-cap", BudgetConfig.paper(max_budget=6), [(2, 2), (4, 4), (6, 6), (6, 6)], [4, 6, 6, 6]),
    ("paper-no-draft", BudgetConfig.paper(), [(2, 2), (0, 0)], [4, 4]),
    ("paper-short-draft-accepted", BudgetConfig.paper(), [(1, 1)], [4]),
    (
        "released",
        BudgetConfig.released(),
        [(2, 2), (4, 4), (8, 8), (16, 16), (16, 16), (16, 3)],
        [4, 8, 16, 16, 16, 8],
    ),
    ("released-floor", BudgetConfig.released(), [(2, 0), (2, 1)], [2, 2]),
    ("released-short-draft", BudgetConfig.released(), [(2, 2), (3, 3)], [4, 2]),  # short draft halves, as released
    ("fixed", BudgetConfig(policy="fixed", fixed=5), [(5, 5), (5, 0)], [5, 5]),
]


@pytest.mark.parametrize("name, cfg, updates, expected", POLICY_TABLE, ids=[p[0] for p in POLICY_TABLE])
def test_policies(name, cfg, updates, expected):
    b = BudgetController(cfg)
    assert b.get("r") == (cfg.fixed if cfg.policy == "fixed" else 2)
    got = []
    for drafted, accepted in updates:
        b.update("r", drafted, accepted)
        got.append(b.get("r"))
    assert got == expected
    b.remove("r")
    assert b.get("r") == (cfg.fixed if cfg.policy == "fixed" else 2)


def test_batch_cap_shrinks_with_batch():
    b = BudgetController(BudgetConfig())
    caps = [b.batch_cap(n) for n in (1, 8, 32, 64, 128, 256, 1024)]
    assert caps == sorted(caps, reverse=True)
    assert caps[0] == 25 and caps[-1] == 0  # default roofline table, cost_limit 1.25
    assert BudgetController(BudgetConfig(cost_limit=None)).batch_cap(4096) == 1024
    assert b.step_total(1) == 25 and b.step_total(64) == 64 * b.batch_cap(64)


def test_step_budgets_cap_the_windows():
    b = BudgetController(BudgetConfig.paper(max_budget=32))
    for _ in range(5):
        b.update("long", b.get("long"), b.get("long"))  # grows to 12
    b.update("short", 2, 2)  # 4
    assert b.get("long") == 12
    assert b.step_budgets(["short", "long", "mid"], batch_size=1) == [4, 12, 2]
    assert b.step_budgets(["short", "long", "mid"], batch_size=64) == [3, 3, 2]  # cap 3 at batch 64
    assert b.step_budgets(["long"], batch_size=256) == [0]
    assert b.step_budgets([]) == []


class _FlatCost:
    def cost(self, k: int, b: int = 1) -> float:
        return 1.0 + 0.1 * (k - 1) * b


def test_custom_cost_table():
    b = BudgetController(BudgetConfig(verify_cost=_FlatCost(), cost_limit=1.5))
    assert [b.batch_cap(n) for n in (1, 2, 5, 6)] == [5, 2, 1, 0]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"policy": "tcp"}, "policy"),
        ({"start": 40, "max_budget": 32}, "start"),
        ({"max_budget": 5000}, "max_budget"),
        ({"cost_limit": 0.5}, "cost_limit"),
        ({"fixed": -1}, "fixed"),
    ],
)
def test_bad_config(kw, message):
    with pytest.raises(ValueError, match=message):
        BudgetConfig(**kw)


@pytest.mark.parametrize("drafted, accepted", [(-1, 0), (2, 3), (1.5, 1), (True, 0)])
def test_bad_update(drafted, accepted):
    with pytest.raises(ValueError):
        BudgetController().update("r", drafted, accepted)


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        BudgetController().batch_cap(0)
