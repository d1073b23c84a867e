"""Cost-aware draft cut: an online model of a verify step's time, and the cut that maximises tokens per second.

``StepCostModel`` fits ``seconds = a + b * B + c * E`` online (B requests, E extra query rows: draft nodes and
merged prefill tokens); ``ProbCalibration`` maps the drafter's path probability (``Draft.probs``, overconfident
on small samples) to the acceptance rate observed for it; with the step's nodes sorted by calibrated probability
``p``, ``best_cut`` returns the ``k`` that maximises ``(B + p_1 + ... + p_k) / (a + b * B + c * (E0 + k))``.
Semantics: docs/drafting.md section 10.

Example::

    model = StepCostModel()
    for extra in (0, 32, 64, 256) * 4:             # 16 steps of 16 requests (min_steps) with 0-256 draft rows
        model.observe(16, 16 + extra, 0.002 + 0.000005 * extra)
    a_b, c = model.base_cost(16), model.row_cost()  # 0.002 s per step without drafts, 5 us per extra row
    best_cut(np.array([0.9, 0.8, 0.1, 0.01]), base_tokens=16, base_cost=a_b, row_cost=c)   # 3
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class StepCostConfig:
    """Configuration of :class:`StepCostModel`."""

    decay: float = 0.99
    """Weight of the past per observed step (0.99: the last few hundred steps count)."""
    min_steps: int = 16
    """Observations before the model is used; until then ``ready`` is False and nothing is cut."""
    refit_every: int = 8
    """Steps between refits of the coefficients (a refit is a 3x3 solve; the sums are updated every step)."""
    pause_steps: int = 16
    """Longest pause: after a step whose best cut was expected to be slower than plain decoding, an engine decodes
    1 step without any drafting work, then drafts once to re-measure; each further such step doubles the pause up
    to this many steps, and a step where drafting pays resets it to 1 (0 = never pause)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"StepCostConfig.decay={self.decay!r}: expected a float in (0, 1)")
        if isinstance(self.min_steps, bool) or not isinstance(self.min_steps, int) or self.min_steps < 3:
            raise ValueError(f"StepCostConfig.min_steps={self.min_steps!r}: expected an int >= 3")
        if isinstance(self.refit_every, bool) or not isinstance(self.refit_every, int) or self.refit_every < 1:
            raise ValueError(f"StepCostConfig.refit_every={self.refit_every!r}: expected an int >= 1")
        if isinstance(self.pause_steps, bool) or not isinstance(self.pause_steps, int) or self.pause_steps < 0:
            raise ValueError(f"StepCostConfig.pause_steps={self.pause_steps!r}: expected an int >= 0")


class StepCostModel:
    """Online fit of ``seconds = a + b * batch + c * (rows - batch)``."""

    def __init__(self, cfg: StepCostConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else StepCostConfig()
        self._xx = np.zeros((3, 3))  # decayed sum of x x^T, x = (1, batch, rows - batch)
        self._xy = np.zeros(3)  # decayed sum of x * seconds
        self._n = 0
        self._coef = np.zeros(3)
        self._stale = False

    @property
    def ready(self) -> bool:
        """True once ``min_steps`` steps were observed and the rows term could be fitted."""
        return self._n >= self.cfg.min_steps

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """Record one verify step: ``batch`` requests, ``rows`` query rows (>= batch), ``seconds`` of wall time."""
        if not (isinstance(batch, int) and batch >= 1 and isinstance(rows, int) and rows >= batch):
            raise ValueError(f"batch={batch!r}, rows={rows!r}: expected ints with 1 <= batch <= rows")
        if not seconds >= 0.0:
            raise ValueError(f"seconds={seconds!r}: expected a float >= 0")
        x = np.array([1.0, float(batch), float(rows - batch)])
        d = self.cfg.decay
        self._xx = d * self._xx + np.outer(x, x)
        self._xy = d * self._xy + x * seconds
        self._n += 1
        self._stale = self._stale or self._n % self.cfg.refit_every == 0 or self._n == self.cfg.min_steps

    def _fit(self) -> np.ndarray:
        if self._stale and self._n >= self.cfg.min_steps:
            # a tiny ridge keeps the 3x3 system solvable when the batch or the extra rows never varied; steps
            # without extra rows leave c at 0 (nothing is cut until drafts were measured)
            ridge = 1e-9 * max(1.0, float(np.trace(self._xx))) * np.eye(3)
            coef = np.linalg.solve(self._xx + ridge, self._xy)
            coef[2] = max(coef[2], 0.0)  # noise can make the row term negative: no row is free of cost
            self._coef = coef
            self._stale = False
        return self._coef

    def base_cost(self, batch: int) -> float:
        """Fitted ``a + b * batch`` (seconds of a step without extra rows), > 0."""
        a, b, _ = self._fit()
        return max(a + b * batch, 1e-9)

    def row_cost(self) -> float:
        """Fitted ``c`` (seconds per extra query row, >= 0)."""
        return float(self._fit()[2])


def best_cut(
    probs_desc: np.ndarray,  # [M] float path probabilities of every draft node of the step, sorted descending
    base_tokens: float,  # tokens the step emits without drafts (one per request)
    base_cost: float,  # seconds of the step without draft rows
    row_cost: float,  # seconds per draft row
) -> int:
    """Number of most likely nodes to keep so that expected tokens per second is largest (the first maximum).

    Example: ``best_cut(np.array([0.9, 0.5, 0.05]), 4, 1.0, 0.1)`` is 2: (4 + 1.4) / 1.2 = 4.5 beats
    (4 + 0.9) / 1.1 = 4.45 and (4 + 1.45) / 1.3 = 4.19.
    """
    if base_cost <= 0 or row_cost < 0 or base_tokens <= 0:
        raise ValueError(
            f"base_cost={base_cost!r}, row_cost={row_cost!r}, base_tokens={base_tokens!r}: expected "
            "base_cost > 0, row_cost >= 0, base_tokens > 0"
        )
    if len(probs_desc) == 0:
        return 0
    gain = np.concatenate(([0.0], np.cumsum(probs_desc, dtype=np.float64)))
    cost = base_cost + row_cost * np.arange(len(gain), dtype=np.float64)
    return int(np.argmax((base_tokens + gain) / cost))


BIN_EDGES = np.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.999])
"""Upper edges of the calibration bins of ``ProbCalibration`` (the last bin holds probability 1.0 alone)."""


@dataclass(slots=True)
class CalibrationConfig:
    """Configuration of :class:`ProbCalibration`."""

    decay: float = 0.98
    """Weight of the past per observed step."""
    prior_nodes: float = 4.0
    """Pseudo-count per bin of the prior "calibrated = the bin's mean drafted probability" (no data: identity)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"CalibrationConfig.decay={self.decay!r}: expected a float in (0, 1]")
        if not self.prior_nodes > 0.0:
            raise ValueError(f"CalibrationConfig.prior_nodes={self.prior_nodes!r}: expected a float > 0")


class ProbCalibration:
    """Drafted path probability -> observed acceptance rate, per probability bin (``BIN_EDGES``).

    Example::

        cal = ProbCalibration()
        cal.observe(np.array([1.0, 1.0, 1.0, 1.0]), np.array([True, False, False, False]))
        cal.calibrate(np.array([1.0]))   # (4 * 1.0 + 1) / (4 + 4) = 0.625: pulled towards the 25 % observed
    """

    def __init__(self, cfg: CalibrationConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else CalibrationConfig()
        bins = len(BIN_EDGES) + 1
        self._nodes = np.zeros(bins)
        self._accepted = np.zeros(bins)
        self._prob_sum = np.zeros(bins)

    @staticmethod
    def _bins(probs: np.ndarray) -> np.ndarray:
        return np.searchsorted(BIN_EDGES, probs, side="left")

    def observe(
        self,
        probs: np.ndarray,  # [n] float drafted path probabilities of one step's verified draft nodes
        accepted: np.ndarray,  # [n] bool whether each node was accepted
    ) -> None:
        """Record one verify step's draft nodes and their outcomes."""
        if probs.shape != accepted.shape:
            raise ValueError(f"probs {probs.shape} and accepted {accepted.shape}: pass one flag per node")
        d = self.cfg.decay
        self._nodes *= d
        self._accepted *= d
        self._prob_sum *= d
        if len(probs):
            b = self._bins(probs)
            bins = len(self._nodes)
            self._nodes += np.bincount(b, minlength=bins)
            self._prob_sum += np.bincount(b, weights=probs, minlength=bins)
            self._accepted += np.bincount(b[accepted], minlength=bins)

    def calibrate(self, probs: np.ndarray) -> np.ndarray:  # [n] float -> [n] float in [0, 1]
        """Expected acceptance of nodes drafted at these path probabilities."""
        b = self._bins(probs)
        prior = self.cfg.prior_nodes
        n = self._nodes[b]
        mean = np.where(n > 0, self._prob_sum[b] / np.maximum(n, 1e-12), probs)  # the bin's drafted probability
        return (self._accepted[b] + prior * mean) / (n + prior)

    def table(self) -> list[dict[str, float]]:
        """One row per bin with data: upper edge, decayed node count, mean drafted and observed acceptance."""
        rows = []
        for i, n in enumerate(self._nodes):
            if n > 0:
                edge = float(BIN_EDGES[i]) if i < len(BIN_EDGES) else 1.0
                rows.append(
                    {
                        "upper": edge,
                        "nodes": float(n),
                        "drafted": float(self._prob_sum[i] / n),
                        "accepted": float(self._accepted[i] / n),
                    }
                )
        return rows
