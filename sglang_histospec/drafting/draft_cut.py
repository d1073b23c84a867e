"""Cost-aware draft cut: an online model of a verify step's time, and the cut that maximises tokens per second.

``StepCostModel`` fits ``seconds = a + b * B + c * E + d * P`` (B requests, E extra query rows of draft trees, P
prefill tokens merged into the pass); ``best_cut`` keeps the k most likely nodes that maximise
``(B + p_1 + ... + p_k) / (a + b * B + d * P + c * k)``. docs/drafting.md section 10.

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

PENDING_MAX = 64
"""Observations a StepCostModel buffers before it adds them to its sums (it adds them at each refit too): observing
a step costs a tuple, not a few small matrix products, on the hot path of every plain step."""


@dataclass(slots=True)
class StepCostConfig:
    """Configuration of :class:`StepCostModel`."""

    decay: float = 0.99
    """Weight of the past per observed step (0.99: the last few hundred steps count)."""
    min_steps: int = 16
    """Observations before the model is used; until then ``ready`` is False and nothing is cut."""
    seed_decay: float = 0.9
    """Weight a seeded step (``observe(..., seeded=True)``: a timed dummy pass) keeps per real step observed, on top of ``decay``: the
    dummy passes lack the host work of a real verify step (tree masks, sampling, commits), so real steps replace
    them within a few tens of drafting steps."""
    refit_every: int = 8
    """Steps between refits of the coefficients (a refit adds the buffered steps to the sums and solves a 4x4 system;
    early on refits come after 1, 2, 4, ... steps)."""
    pause_steps: int = 64
    """Longest pause: after a step whose best cut was expected to be slower than plain decoding, an engine decodes
    1 step without any drafting work, then drafts once to re-measure; each further such step doubles the pause up
    to this many steps, and a step where drafting pays resets it to 1 (0 = never pause)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.seed_decay <= 1.0:
            raise ValueError(f"StepCostConfig.seed_decay={self.seed_decay!r}: expected a float in (0, 1]")
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"StepCostConfig.decay={self.decay!r}: expected a float in (0, 1)")
        if isinstance(self.min_steps, bool) or not isinstance(self.min_steps, int) or self.min_steps < 3:
            raise ValueError(f"StepCostConfig.min_steps={self.min_steps!r}: expected an int >= 3")
        if isinstance(self.refit_every, bool) or not isinstance(self.refit_every, int) or self.refit_every < 1:
            raise ValueError(f"StepCostConfig.refit_every={self.refit_every!r}: expected an int >= 1")
        if isinstance(self.pause_steps, bool) or not isinstance(self.pause_steps, int) or self.pause_steps < 0:
            raise ValueError(f"StepCostConfig.pause_steps={self.pause_steps!r}: expected an int >= 0")


class StepCostModel:
    """Online fit of ``seconds = a + b * batch + c * (rows - batch) + d * prefill``.

    A draft row and a merged prefill token both add a query row to the forward, but only a draft row carries the
    host work of drafting, verifying and committing a node; one coefficient for both would price draft rows at the
    cheaper prefill rate on every step that merges a prefill."""

    def __init__(self, cfg: StepCostConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else StepCostConfig()
        self._xx = np.zeros((2, 4, 4))  # decayed sums of x x^T, x = (1, batch, rows - batch, prefill): [real, seeded]
        self._xy = np.zeros((2, 4))  # decayed sums of x * seconds: [real, seeded]
        self._n = 0.0  # observed and seeded steps (weighted, not decayed): ready once >= min_steps
        self._since_fit = 0  # observations since the last refit
        self._steps = 0  # observations (not weighted): the early refit schedule counts them
        self._fitted = False  # refitted at least once since ready
        self._coef = np.zeros(4)
        self._stale = False
        self._pending: list[tuple[float, ...]] = []  # observations not yet in the sums (``_fold``)

    @property
    def ready(self) -> bool:
        """True once ``min_steps`` steps were observed and the rows term could be fitted."""
        return self._n >= self.cfg.min_steps

    def observe(
        self, batch: int, rows: int, seconds: float, weight: float = 1.0, seeded: bool = False, prefill: int = 0
    ) -> None:
        """Record one verify step: ``batch`` requests, ``rows`` tree query rows (>= batch), ``prefill`` prefill
        tokens merged into its pass, ``seconds`` of wall time; ``weight`` counts it as that many steps; ``seeded``: a
        timed dummy pass (engine/profile.py), whose weight also fades by ``seed_decay`` with each real step."""
        if not (isinstance(batch, int) and batch >= 1 and isinstance(rows, int) and rows >= batch):
            raise ValueError(f"batch={batch!r}, rows={rows!r}: expected ints with 1 <= batch <= rows")
        if not (isinstance(prefill, int) and prefill >= 0):
            raise ValueError(f"prefill={prefill!r}: expected an int >= 0")
        if not seconds >= 0.0:
            raise ValueError(f"seconds={seconds!r}: expected a float >= 0")
        if not weight > 0.0:
            raise ValueError(f"weight={weight!r}: expected a float > 0")
        self._pending.append((float(batch), float(rows - batch), float(prefill), seconds, weight, float(seeded)))
        self._n += weight
        self._steps += 1
        self._since_fit += 1
        self._stale = self._stale or self._since_fit >= self._refit_gap() or not self._fitted
        if len(self._pending) >= PENDING_MAX:
            self._fold()

    def observe_plain(self, steps: list[tuple[int, int, float]]) -> None:
        """``observe(batch, batch, seconds, prefill=prefill)`` of each ``(batch, prefill, seconds)`` in ``steps``, in
        order, for steps the caller already validated (the governor's queue of its own plain steps): the same sums,
        without a call and three checks per step."""
        if not steps:
            return
        pending, fold = self._pending, self._fold
        for batch, prefill, seconds in steps:
            pending.append((float(batch), 0.0, float(prefill), seconds, 1.0, 0.0))
            self._n += 1.0
            if len(pending) >= PENDING_MAX:
                fold()
        self._steps += len(steps)
        self._since_fit += len(steps)
        # the refit gap is fixed while observations come in (both counts grow alike): one check covers them all
        self._stale = self._stale or self._since_fit >= self._refit_gap() or not self._fitted

    def _fold(self) -> None:
        """Add the pending observations to the decayed sums at once, as ``observe`` one by one would: a real step
        first decays every earlier one by ``decay`` (a seeded one by ``decay * seed_decay`` as well)."""
        if not self._pending:
            return
        p = np.array(self._pending)  # [m, 6]: batch, extra rows, prefill, seconds, weight, seeded
        self._pending.clear()
        x = np.column_stack((np.ones(len(p)), p[:, :3]))  # [m, 4]
        real = p[:, 5] == 0.0
        later = (np.cumsum(real[::-1])[::-1] - real).astype(np.float64)  # real steps observed after each one
        d, ds = self.cfg.decay, self.cfg.decay * self.cfg.seed_decay
        n_real = float(real.sum())
        for k, (rate, mine) in enumerate(((d, real), (ds, ~real))):
            self._xx[k] *= rate**n_real
            self._xy[k] *= rate**n_real
            w = np.where(mine, p[:, 4] * rate**later, 0.0)  # [m]
            self._xx[k] += (x * w[:, None]).T @ x
            self._xy[k] += (x * w[:, None]).T @ p[:, 3]

    def _fit(self) -> np.ndarray:
        if self._stale and self._n >= self.cfg.min_steps:
            self._fold()
            # a tiny ridge keeps the 4x4 system solvable when the batch, the extra rows or the prefills never
            # varied; steps without extra rows leave c at 0 (nothing is cut until drafts were measured)
            xx, xy = self._xx.sum(axis=0), self._xy.sum(axis=0)
            ridge = 1e-9 * max(1.0, float(np.trace(xx))) * np.eye(4)
            coef = np.linalg.solve(xx + ridge, xy)
            keep = [0, 1, 2, 3]
            for term in (1, 0):  # neither a request nor a step costs less than nothing: refit without that term
                if coef[term] < 0.0:  # (a negative intercept priced the steps of a smaller batch at about 0)
                    keep.remove(term)
                    coef = np.zeros(4)
                    coef[keep] = np.linalg.solve((xx + ridge)[np.ix_(keep, keep)], xy[keep])
            coef[2:] = np.maximum(coef[2:], 0.0)  # noise can make a row term negative: no row is free of cost
            self._coef = coef
            self._stale, self._since_fit, self._fitted = False, 0, True
        return self._coef

    def _refit_gap(self) -> int:
        """Observations between the last refit and the next: ``refit_every``, fewer while few steps are in (refits
        after 1, 2, 4, ... of them)."""
        return min(self.cfg.refit_every, self._steps - self._since_fit)

    def steps_to_refit(self) -> int:
        """Observations after which the next ``base_cost``/``row_cost``/``prefill_cost`` refits (0: the next one does;
        until then they return what they return now)."""
        if not self._fitted or self._stale:
            return 0
        return max(0, self._refit_gap() - self._since_fit)

    def base_cost(self, batch: int) -> float:
        """Fitted ``a + b * batch`` (seconds of a step without extra rows), > 0."""
        a, b = self._fit()[:2]
        return max(a + b * batch, 1e-9)

    def intercept(self) -> float:
        """Fitted ``a`` (seconds of a step that no request adds to, >= 0): what a step saves that a batch no longer
        needs, against ``b`` per request (``base_cost(1) - intercept()``)."""
        return float(self._fit()[0])

    def row_cost(self) -> float:
        """Fitted ``c`` (seconds per extra query row of a draft tree, >= 0)."""
        return float(self._fit()[2])

    def prefill_cost(self) -> float:
        """Fitted ``d`` (seconds per prefill token merged into a verify pass, >= 0; 0 until prefills were seen)."""
        return float(self._fit()[3])


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
