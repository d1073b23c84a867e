"""How many draft nodes a step verifies: one ``DraftPolicy`` interface, one implementation (``DraftSizePolicy``).

What the engine asks each step: the budget of every running request (all 0 for a plain step: ``drafts`` decides),
the cut of the drafted trees (``cut``), and, after the verify, the feedback (``observe``: timings and accepted
nodes; ``request_step`` / ``request_done``: a request's accepted length and its end). ``DraftSizePolicy`` composes
the per-request budgets (``drafting/budget.py``), the cost cut (``drafting/draft_cut.py``) with its calibration, the
measured guard (``engine/governor.py``) and the pauses, ramp and acceptance scale; its knobs are
``EngineConfig.policy`` (a ``DraftPolicyConfig``) and ``EngineConfig.draft_selection`` (docs/drafting.md section 10).

Example::

    policy = DraftSizePolicy(EngineConfig(model_path="m", draft_selection="always"), drafter, max_context_len=2048)
    policy.step_budgets(running)    # e.g. [2, 2]: the AIMD windows, capped by num_draft_tokens and the room left
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sglang_histospec.drafting.calibration import DraftCalibration
from sglang_histospec.drafting.draft_cut import StepCostModel, best_cut
from sglang_histospec.drafting.flat import FlatDrafts
from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.engine.governor import SpecGovernor
from sglang_histospec.engine.request import RequestState
from sglang_histospec.engine.treebatch import TreeBatch, WalkResult
from sglang_histospec.engine.types import DraftPolicyConfig, EngineConfig

SCALE_RANGE = (0.05, 2.0)
"""Bounds of the acceptance scale (``DraftSizePolicy.acceptance_scale``)."""


@dataclass(slots=True)
class Selection:
    """What one step verifies (``engine/selector.py`` builds it; the policy learns from it)."""

    tb: TreeBatch
    """The trees of the running requests, in running order (a request without draft nodes: its root alone)."""
    flat: FlatDrafts | None
    """The step's drafts within their budgets (None when the drafter was not asked)."""
    nodes: np.ndarray
    """[N] int64 flat index of every verified draft node, in the order of the tree rows that are not roots."""
    drafted: bool
    """The drafter was asked (some budget > 0): a step with drafting work."""
    predicted: float = 0.0
    """Sum of the calibrated (unscaled) path probabilities of the verified nodes, when the cut weighed them."""
    host_s: float = 0.0
    """Seconds from the step's start to the end of its selection (the drafting host work), when it drafted."""


class DraftPolicy(Protocol):
    """What the engine loop and the selector ask about draft sizes."""

    speculate: bool
    """Drafting is on at all (HistoSpec with ``num_draft_tokens > 0``)."""
    learns_depths: bool
    """``request_step`` changes later budgets (the commit skips it otherwise)."""
    cut_on: bool
    """The cost cut weighs the drafts: its step model wants the timed dummy passes of ``seed_step_cost``."""

    def step_budgets(self, running: list[RequestState]) -> list[int]:
        """Draft nodes each running request may get this step (all 0: a plain step)."""

    def drafts(self, bsz: int) -> bool:
        """Whether the next step of ``bsz`` requests may draft (no pause, the measured guard agrees)."""

    def cut(self, flat: FlatDrafts, bsz: int, prefill: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Which drafted nodes the step verifies ([n] bool) and their calibrated probabilities (None: unweighed)."""

    def observe(self, sel: Selection, walks: list[WalkResult], bsz: int, prefill: int, emitted: int,
                started: float, critical: int | None = None) -> None:  # fmt: skip
        """Learn from a verified step: its selection, walks, timing and tokens."""

    def request_step(self, rid: str, depth: int, accepted: int) -> None:
        """A request's verify outcome: its tree's depth and accepted length."""

    def request_done(self, rid: str) -> None:
        """A request finished or was aborted."""

    def seed_step_cost(self, points: list[tuple[int, int, float]]) -> None:
        """Fit the step model to timed dummy passes ``(requests, rows, seconds)``."""

    def stats(self) -> dict:
        """The policy's models and counters (``Engine.stats()["step_cost"]``)."""


def default_budgets(config: EngineConfig):
    """The budget controller of ``config``: ``policy.budget``, else with the cost cut a fixed budget of
    ``num_draft_tokens`` (the cut sizes the trees), else the ``drafting`` default (AIMD)."""
    from sglang_histospec.drafting import BudgetConfig, BudgetController

    budget = config.policy.budget
    if budget is None and config.draft_selection == "adaptive":  # the cut sizes the trees
        budget = BudgetConfig(policy="fixed", fixed=config.num_draft_tokens, cost_limit=None)
    return BudgetController(budget or BudgetConfig())


class DraftSizePolicy:
    """The draft-size policy: per-request budgets, the cost cut, pauses and the measured guard.

    ``drafter`` is the engine's (its ``open_step`` marks a new history, its ``calibration`` is shared with replay
    and the plugin); ``budgets`` any object with ``step_budgets, update, remove`` (default: ``default_budgets``).
    Models: ``step_cost`` (StepCostModel), ``calibration`` (DraftCalibration), ``governor`` (SpecGovernor with
    ``draft_selection="adaptive"``, else None), ``budgets``; ``counts``: draft_pauses, paused_steps.

    Each step ``step_budgets`` asks the budget controller for every running request's budget (capped by
    ``num_draft_tokens``, the tokens left and the context room; all 0 while paused, when the governor measures plain
    steps faster, or without speculation), and, with ``draft_selection="adaptive"``, ``cut`` keeps only the nodes
    whose calibrated path probability clears the cost cut's threshold. ``observe`` then feeds the step's outcome
    back: the calibration learns what was accepted, the step model the measured time, the governor the tokens/s.

    The cut: a node of calibrated probability p is worth p expected tokens and costs one verify row. The step keeps
    the k best nodes of the batch that maximise tokens per second under the step model; when even that rate is below
    a plain step's (the step's cost less the drafting time it saves), the next steps do not draft: 1, then 2, 4, ...
    up to ``pause_steps`` while that keeps happening. A step the governor does not trust yet (a probe of drafting,
    or one before drafting was measured to win at this batch size) keeps at most ``probe_cost x`` the step's cost
    in rows: a probe that loses costs little, and the first steps of a new history are not spent on long trees
    scored by rates learnt from another history. A trusted step keeps at most that cap times a ramp
    (``GovernorConfig.ramp_max``): 1 at a new history step, doubled after each drafting step whose accepted nodes
    paid for its draft rows and that ran at least as fast as the bucket's plain steps, halved after each other one.

    The acceptance scale: the cut weighs each calibrated probability times the ratio of accepted to predicted
    nodes over the recent drafting steps (decayed sums, ``GovernorConfig.scale_decay``, from ``scale_prior``
    predicted nodes of ratio 1 at each new history step), so that a scorer overconfident on this history (its rates
    were learnt on another) stops paying rows for nodes the target rejects within a step or two, and one that is
    underconfident gets more.
    """

    def __init__(self, config: EngineConfig, drafter: Drafter, max_context_len: int, budgets=None) -> None:
        pcfg: DraftPolicyConfig = config.policy
        self.drafter = drafter
        self.budgets = budgets if budgets is not None else default_budgets(config)
        self.num_draft_tokens = config.num_draft_tokens
        self.max_context_len = max_context_len
        self.counts: collections.Counter = collections.Counter()
        self.speculate = config.speculative_algorithm == "HISTOSPEC" and config.num_draft_tokens > 0
        self.cut_on = self.speculate and config.draft_selection == "adaptive"
        # fixed budgets learn nothing from a step's outcome
        self.learns_depths = self.speculate and getattr(getattr(self.budgets, "cfg", None), "policy", None) != "fixed"
        self.step_cost = StepCostModel(pcfg.step_cost)
        self.calibration: DraftCalibration = drafter.calibration  # the drafter's, shared with replay and the plugin
        self.governor = SpecGovernor(pcfg.governor) if self.cut_on else None
        self._pause = 0  # steps left without drafting: the last cut expected drafting to be slower than plain steps
        self._pause_len = 1  # length of the next pause (doubles while drafting keeps not paying)
        self._draft_s = 0.0  # decayed mean host time of a step's drafting work (seconds), saved by a paused step
        self._history_step = drafter.open_step
        self._scale = [0.0, 0.0]  # decayed sums of accepted and predicted verified nodes (the acceptance scale)
        self._ramp = 1.0  # multiple of the probe cap a trusted step may keep (doubles while drafting steps pay)

    def seed_step_cost(self, points: list[tuple[int, int, float]]) -> None:
        """Fit the step model to timed dummy passes ``(requests, rows, seconds)`` (``engine/profile.py``), weighed
        together as much as the model's ``min_steps`` real steps at first, fading as real steps come in."""
        weight = self.step_cost.cfg.min_steps / len(points)
        for batch, rows, seconds in points:
            self.step_cost.observe(batch, rows, seconds, weight=weight, seeded=True)

    def drafts(self, bsz: int) -> bool:
        """Whether the next step of ``bsz`` requests may draft: not paused and, with the governor, measured to pay
        (a new history step ends a pause and lets drafting be measured anew)."""
        step = self.drafter.open_step
        if step != self._history_step:  # new history: whether drafting pays is measured anew
            self._history_step = step
            self._pause, self._pause_len = 0, 1
            self._scale, self._ramp = [0.0, 0.0], 1.0
            if self.governor is not None:
                self.governor.forget_drafting()
        return self._pause <= 0 and (self.governor is None or self.governor.use_spec(bsz))

    def step_budgets(self, running: list[RequestState]) -> list[int]:
        """Draft nodes each running request may get this step (0 = none)."""
        if not self.speculate or not self.drafts(len(running)):
            return [0] * len(running)
        rids = [st.req.rid for st in running]
        raw = self.budgets.step_budgets(rids, len(running))
        out = []
        for st, b in zip(running, raw):
            left = st.req.sampling.max_new_tokens - len(st.output) - 1
            room = self.max_context_len - len(st.tokens)
            out.append(max(0, min(int(b), self.num_draft_tokens, left, room)))
        return out

    def request_step(self, rid: str, depth: int, accepted: int) -> None:
        """A request's verify outcome (its tree's depth, its accepted length) for its budget."""
        self.budgets.update(rid, depth, accepted)

    def request_done(self, rid: str) -> None:
        """Forget a finished or aborted request's budget."""
        self.budgets.remove(rid)

    def acceptance_scale(self) -> float:
        """Accepted over predicted verified nodes, decayed, from ``scale_prior`` nodes of ratio 1 (1.0 without the
        governor's settings, i.e. without the cut)."""
        if self.governor is None:
            return 1.0
        prior = self.governor.cfg.scale_prior
        return min(max((self._scale[0] + prior) / (self._scale[1] + prior), SCALE_RANGE[0]), SCALE_RANGE[1])

    def cut(self, flat: FlatDrafts, bsz: int, prefill: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Which nodes of ``flat`` the cut keeps ([n] bool: all without the cut or before the step model is ready)
        and their calibrated path probabilities (None when the cut did not weigh them): the ``_keep`` most likely
        nodes of the batch by calibrated probability times the acceptance scale (ties in draft and BFS order, so a
        parent, never less likely than its child, comes first)."""
        keep = np.ones(len(flat), dtype=bool)
        if not (self.cut_on and self.step_cost.ready):
            return keep, None
        probs = self.calibration.calibrate_flat(flat)
        weighed = np.minimum(probs * self.acceptance_scale(), 1.0)
        order = np.argsort(-weighed, kind="stable")
        k = self._keep(weighed[order], bsz, prefill)
        if k < len(flat):
            keep[order[k:]] = False
        return keep, probs

    def _keep(self, desc: np.ndarray, bsz: int, prefill: int) -> int:
        """How many of the most likely draft nodes the step verifies: the cost-aware cut over ``desc`` [n], the
        calibrated path probabilities of every request's draft nodes within its budget, sorted descending, for a
        step that also carries ``prefill`` merged prefill tokens; capped for a probe (the class docstring); at
        least 1, so that the calibration keeps learning. Starts a pause when drafting is not expected to pay."""
        if not len(desc):
            return 0
        model = self.step_cost
        row = model.row_cost()
        base = model.base_cost(bsz) + model.prefill_cost() * prefill
        k = best_cut(desc, float(bsz), base, row)
        spec_rate = (bsz + float(desc[:k].sum())) / (base + row * k)
        if spec_rate < bsz / max(base - self._draft_s, 1e-9):
            self._pause = min(self._pause_len, model.cfg.pause_steps)
            self._pause_len = min(2 * self._pause_len, max(1, model.cfg.pause_steps))
            self.counts["draft_pauses"] += self._pause > 0
        else:
            self._pause_len = 1
        gov = self.governor
        if gov is not None and row > 0.0 and math.isfinite(gov.cfg.probe_cost):  # a probe: its best nodes only
            k = min(k, int(gov.cfg.probe_cost * base / row * (self._ramp if gov.trusts_spec(bsz) else 1.0)))
        return max(k, 1)

    def observe(
        self,
        sel: Selection,
        walks: list[WalkResult],
        bsz: int,
        prefill: int,
        emitted: int,
        started: float,
        critical: int | None = None,
    ) -> None:
        """Learn from a finished step: its selection, walks, batch size, merged prefill tokens, tokens emitted,
        ``time.perf_counter()`` start and, when nothing waits to join the batch, its ``critical_progress``."""
        if not self.speculate:
            return
        seconds = time.perf_counter() - started
        if sel.drafted:  # the drafting host work a paused step saves
            self._draft_s = 0.9 * self._draft_s + 0.1 * sel.host_s
        prefill_s = self.step_cost.prefill_cost() * prefill if prefill else 0.0  # modelled (no refit when none)
        decode_s = max(seconds - prefill_s, 1e-6)
        # what a drafting step should cost beyond a plain one: its extra rows by the step model, its host work
        extra = (
            (sel.tb.num_rows - bsz) * self.step_cost.row_cost() + sel.host_s
            if sel.drafted and self.step_cost.ready
            else None
        )
        if len(sel.nodes):  # what was accepted calibrates the drafted probabilities
            accepted = self._learn(sel, walks)
            if sel.predicted > 0.0 and self.governor is not None:
                credit = self.governor.credit(bsz, emitted, critical)  # what the step saved, in plain tokens
                rated = self.governor.rate_seconds(bsz, decode_s, extra)
                self._learn_scale(sel, accepted, credit - (emitted - accepted), bsz, credit / rated)
        if sel.drafted:  # steps that drafted: a paused step has no drafting work and would bias the fit
            self.step_cost.observe(bsz, sel.tb.num_rows, seconds, prefill=prefill)
        elif self._pause > 0:
            self._pause -= 1
            self.counts["paused_steps"] += 1
        if self.governor is not None:  # measured tokens/s
            self.governor.observe(
                bsz, sel.drafted, emitted, decode_s, prefill=prefill, wall_s=seconds, critical=critical, extra_s=extra
            )

    def _learn_scale(self, sel: Selection, accepted: int, saved: float, bsz: int, rate: float) -> None:
        """Update the acceptance scale and the ramp from a step the cut weighed, of which ``accepted`` verified nodes
        were accepted, worth ``saved`` plain tokens as the governor credits them, and which emitted ``rate`` tokens/s
        (credited alike): did its accepted nodes pay for its draft rows, at the step model's cost of a row against a
        plain step's cost per token, and was it as fast as the plain steps the governor measured in its bucket?"""
        cfg = self.governor.cfg
        self._scale = [cfg.scale_decay * self._scale[0] + accepted, cfg.scale_decay * self._scale[1] + sel.predicted]
        rows = sel.tb.num_rows - bsz
        paid = saved * self.step_cost.base_cost(bsz) >= rows * self.step_cost.row_cost() * bsz
        plain = self.governor.plain_rate(bsz)
        paid = paid and (plain is None or rate >= plain)
        self._ramp = min(2.0 * self._ramp, cfg.ramp_max) if paid else max(0.5 * self._ramp, 1.0)

    def _learn(self, sel: Selection, walks: list[WalkResult]) -> int:
        """Teach the calibration this step's verified nodes (``sel.nodes``), of which the walks accepted those on
        their paths; returns how many were accepted."""
        flat = sel.flat
        node_of_row = np.full(sel.tb.num_rows, -1, dtype=np.int64)  # tree row -> flat node (-1: a root)
        node_of_row[sel.tb.local > 0] = sel.nodes
        accepted_rows = [r for w in walks for r in w.rows[1:]]
        hit = np.zeros(len(flat), dtype=bool)
        hit[node_of_row[accepted_rows]] = True
        seen = np.zeros(len(flat), dtype=bool)
        seen[sel.nodes] = True
        self.calibration.observe_flat(flat, hit, seen)
        return len(accepted_rows)

    def stats(self) -> dict:
        """ready, row_cost_s (the step model), calibration (its bins), draft_pauses (times the cut stopped drafting),
        paused_steps, governor (its counters; {} without it)."""
        return {
            "ready": self.step_cost.ready,
            "row_cost_s": self.step_cost.row_cost(),
            "calibration": self.calibration.table(),
            "draft_pauses": int(self.counts["draft_pauses"]),
            "paused_steps": int(self.counts["paused_steps"]),
            "governor": {} if self.governor is None else dict(self.governor.stats),
        }
