"""Per-request draft budgets: AIMD windows and a batch-size cap from a verify-cost table.

Policies (``BudgetConfig.policy``): ``paper`` (RhymeRL's paper: +2 after a fully accepted draft, back to 2 on a
rejection), ``released`` (RhymeRL's code: x2 / /2) and ``fixed``; ``step_budgets`` caps every window at
``batch_cap(batch_size)`` from the ``VerifyCostTable``. Exact rules: docs/drafting.md section 10.

Example::

    b = BudgetController(BudgetConfig(policy="paper"))
    b.get("r")                        # 2
    b.update("r", drafted=2, accepted=2); b.get("r")   # 4
    b.update("r", drafted=4, accepted=1); b.get("r")   # 2
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sglang_histospec.drafting.types import MAX_BUDGET

POLICIES = ("paper", "released", "fixed")


@dataclass(slots=True)
class BudgetConfig:
    """Configuration of :class:`BudgetController`."""

    policy: str = "paper"
    """"paper" (+increase / reset), "released" (x2 / /2) or "fixed"."""
    start: int = 2
    """Budget of a new request (and the reset value of the paper policy)."""
    increase: int = 2
    """Additive increase of the paper policy after a fully accepted draft."""
    min_budget: int = 2
    """Lower bound of the released policy's window."""
    max_budget: int = 32
    """Upper bound of the window (paper 32, released 16)."""
    fixed: int = 8
    """Budget of the fixed policy."""
    cost_limit: float | None = 1.25
    """Per-request cap: verifying k nodes + root may cost at most this many plain decode steps; None = no cap."""
    verify_cost: object | None = None
    """A ``VerifyCostTable`` (anything with ``cost(k, b)``); None = ``VerifyCostTable.default()``."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"BudgetConfig.policy={self.policy!r}: expected one of {POLICIES}")
        for name in ("start", "increase", "min_budget", "max_budget", "fixed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > MAX_BUDGET * 1000:
                raise ValueError(f"BudgetConfig.{name}={v!r}: expected a non-negative int")
        if self.max_budget > MAX_BUDGET or self.fixed > MAX_BUDGET:
            raise ValueError(f"BudgetConfig.max_budget/fixed must be <= {MAX_BUDGET}")
        if not (self.min_budget <= self.start <= self.max_budget):
            raise ValueError(
                f"BudgetConfig: need min_budget <= start <= max_budget, got {self.min_budget}, {self.start}, "
                f"{self.max_budget}"
            )
        if self.cost_limit is not None and not self.cost_limit >= 1.0:
            raise ValueError(f"BudgetConfig.cost_limit={self.cost_limit!r}: expected None or a float >= 1.0")

    @classmethod
    def paper(cls, **kw) -> BudgetConfig:
        return cls(**{"policy": "paper", "start": 2, "increase": 2, "min_budget": 2, "max_budget": 32, **kw})

    @classmethod
    def released(cls, **kw) -> BudgetConfig:
        return cls(**{"policy": "released", "start": 2, "min_budget": 2, "max_budget": 16, **kw})


class BudgetController:
    """Per-request adaptive budgets (thread-safe); the module docstring has an example, docs/drafting.md section 10
    the exact rules of each policy and of the batch cap."""

    def __init__(self, cfg: BudgetConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else BudgetConfig()
        self._budget: dict[str, int] = {}
        self._caps: dict[int, int] = {}
        self._lock = threading.Lock()
        self._table = self.cfg.verify_cost
        if self._table is None and self.cfg.cost_limit is not None:
            from sglang_histospec.drafting.verify_cost import VerifyCostTable

            self._table = VerifyCostTable.default()

    def get(self, req_id: str) -> int:
        """The request's current window (before the batch cap)."""
        if self.cfg.policy == "fixed":
            return self.cfg.fixed
        with self._lock:
            return self._budget.get(req_id, self.cfg.start)

    def update(self, req_id: str, drafted: int, accepted: int) -> None:
        """Record a verify step: ``drafted`` = depth of the draft (nodes of a chain), ``accepted`` = accepted length."""
        for name, v in (("drafted", drafted), ("accepted", accepted)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r}: expected an int >= 0")
        if accepted > drafted:
            raise ValueError(f"accepted={accepted} > drafted={drafted}: accepted counts draft tokens only")
        c = self.cfg
        if c.policy == "fixed":
            return
        with self._lock:
            b = self._budget.get(req_id, c.start)
            if c.policy == "paper":
                if drafted:
                    b = min(b + c.increase, c.max_budget) if accepted >= drafted else c.start
            else:
                b = min(2 * b, c.max_budget) if accepted >= b else max(c.min_budget, b // 2)
            self._budget[req_id] = b

    def remove(self, req_id: str) -> None:
        with self._lock:
            self._budget.pop(req_id, None)

    def batch_cap(self, batch_size: int) -> int:
        """Largest k with cost(k + 1, batch_size) <= cost_limit (MAX_BUDGET when there is no limit)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: expected an int >= 1")
        if self.cfg.cost_limit is None:
            return MAX_BUDGET
        cap = self._caps.get(batch_size)
        if cap is None:
            cap = 0
            while cap < MAX_BUDGET and self._table.cost(cap + 2, batch_size) <= self.cfg.cost_limit:
                cap += 1
            self._caps[batch_size] = cap
        return cap

    def step_total(self, batch_size: int) -> int:
        """Most draft nodes one engine step may verify in total at this batch size: ``batch_size * batch_cap``."""
        return batch_size * self.batch_cap(batch_size)

    def step_budgets(self, req_ids: list[str], batch_size: int | None = None) -> list[int]:
        """Budgets for one engine step: each request's window, capped by ``batch_cap(batch_size)``.

        ``batch_size`` defaults to ``len(req_ids)``.
        """
        cap = self.batch_cap(len(req_ids) if batch_size is None else batch_size) if req_ids else 0
        return [min(cap, self.get(r)) for r in req_ids]
