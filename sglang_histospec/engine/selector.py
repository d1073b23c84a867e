"""Which draft nodes a verify step verifies: per-request budgets, the batch-wide cost cut, pauses, the governor.

``DraftSelector.select`` picks the step's trees, ``observe`` feeds the outcome back (rules: its class docstring;
docs/drafting.md section 10). Example (``pack_draft``, the per-request part): the draft root -> 5 -> 6 and
root -> 7, path probabilities 0.9, 0.2 (node 6) and 0.5, with ``min_score=0.4`` keeps draft nodes 0 and 1::

    pack_draft(Draft([5, 7, 6], [ROOT, ROOT, 0], [0.9, 0.5, 0.2]), budget=4, vocab_size=64, min_score=0.4)
    # ([0, 5, 7], [-1, 0, 0], [0, 1]): the root (token filled in later), 5 and 7, both children of the root
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass

import numpy as np

from sglang_histospec.drafting import ROOT, Draft
from sglang_histospec.drafting.calibration import DraftCalibration
from sglang_histospec.drafting.draft_cut import StepCostModel, best_cut
from sglang_histospec.engine.governor import SpecGovernor
from sglang_histospec.engine.request import RequestState
from sglang_histospec.engine.treebatch import TreeBatch, WalkResult
from sglang_histospec.engine.types import EngineConfig

SCALE_RANGE = (0.05, 2.0)
"""Bounds of the acceptance scale (``DraftSelector.acceptance_scale``)."""


def pack_draft(
    draft: Draft, budget: int, vocab_size: int, min_score: float = 0.0, scores: list[float] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Keep at most ``budget`` nodes whose token is in the vocabulary, whose score (``scores[i]``, default the
    draft's path probability) is at least ``min_score`` and whose parent was kept.

    Returns (tokens, parents, kept) of the packed tree: node 0 = root (token filled in by the caller), kept draft
    node ``kept[j]`` -> node j + 1, parent ROOT -> 0.
    """
    ids = draft.token_ids
    if scores is None:
        scores = draft.probs
    if len(ids) <= budget and min(ids) >= 0 and max(ids) < vocab_size and min(scores) >= min_score:  # keep all
        return [0, *ids], [-1, *(0 if p == ROOT else p + 1 for p in draft.parents)], list(range(len(ids)))
    tokens, parents, kept = [0], [-1], []
    remap: dict[int, int] = {ROOT: 0}
    for i, (tok, par) in enumerate(zip(ids, draft.parents)):
        if len(tokens) > budget:
            break
        if par not in remap or not 0 <= tok < vocab_size or scores[i] < min_score:
            continue
        remap[i] = len(tokens)
        tokens.append(int(tok))
        parents.append(remap[par])
        kept.append(i)
    return tokens, parents, kept


@dataclass(slots=True)
class Selection:
    """What one step verifies."""

    tb: TreeBatch
    """The trees of the running requests, in running order (a request without draft nodes: its root alone)."""
    verified: dict[int, tuple[Draft, list[int]]]
    """Request -> its draft and the draft nodes kept (they became tree nodes 1..), for requests with a tree."""
    drafted: bool
    """The drafter was asked (some budget > 0): a step with drafting work."""
    predicted: float = 0.0
    """Sum of the calibrated (unscaled) path probabilities of the verified nodes, when the cut weighed them."""


class DraftSelector:
    """Owns the drafting decisions of the engine and the models they learn: ``step_cost`` (StepCostModel),
    ``calibration`` (the drafter's DraftCalibration when it has one) and ``governor`` (SpecGovernor, with the cut).

    ``drafter`` and ``budgets`` are the engine's (core HistoSpecDrafter / BudgetController API); ``stats`` is the
    engine's counter (``draft_pauses``, ``paused_steps``).

    Each step ``select`` asks the budget controller for every running request's budget (capped by
    ``num_draft_tokens``, the tokens left and the context room; all 0 while paused, when the governor measures plain
    steps faster, or without speculation), asks the drafter for trees within them, and, with
    ``draft_selection="cost"``, keeps only the nodes whose calibrated path probability clears the cost cut's
    threshold. ``observe`` then feeds the step's outcome back: the calibration learns what was accepted, the step
    model the measured time, the governor the tokens/s.

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

    def __init__(
        self,
        config: EngineConfig,
        drafter,
        budgets,
        max_context_len: int,
        vocab_size: int,
        stats: collections.Counter,
    ) -> None:
        self.config = config
        self.drafter = drafter
        self.budgets = budgets
        self.max_context_len = max_context_len
        self.vocab_size = vocab_size
        self.stats = stats
        self.speculate = config.speculative_algorithm == "HISTOSPEC" and config.num_draft_tokens > 0
        self.cut = self.speculate and config.draft_selection == "cost"
        self.step_cost = StepCostModel()
        # the drafter's calibration when it has one (HistoSpecDrafter does), so replay and the plugin share it
        self.calibration = getattr(drafter, "calibration", None) or DraftCalibration()
        self.governor = SpecGovernor(config.governor) if self.cut else None
        self._pause = 0  # steps left without drafting: the last cut expected drafting to be slower than plain steps
        self._pause_len = 1  # length of the next pause (doubles while drafting keeps not paying)
        self._draft_s = 0.0  # decayed mean host time of a step's drafting work (seconds), saved by a paused step
        self._history_step = getattr(drafter, "open_step", None)
        self._scale = [0.0, 0.0]  # decayed sums of accepted and predicted verified nodes (the acceptance scale)
        self._ramp = 1.0  # multiple of the probe cap a trusted step may keep (doubles while drafting steps pay)

    def seed_step_cost(self, points: list[tuple[int, int, float]]) -> None:
        """Fit the step model to timed dummy passes ``(requests, rows, seconds)`` (``engine/profile.py``), weighed
        together as much as the model's ``min_steps`` real steps at first, fading as real steps come in."""
        weight = self.step_cost.cfg.min_steps / len(points)
        for batch, rows, seconds in points:
            self.step_cost.observe(batch, rows, seconds, weight=weight, seeded=True)

    def step_budgets(self, running: list[RequestState]) -> list[int]:
        """Draft nodes each running request may get this step (0 = none)."""
        if not self.speculate:
            return [0] * len(running)
        step = getattr(self.drafter, "open_step", None)
        if step != self._history_step:  # new history: whether drafting pays is measured anew
            self._history_step = step
            self._pause, self._pause_len = 0, 1
            self._scale, self._ramp = [0.0, 0.0], 1.0
            if self.governor is not None:
                self.governor.forget_drafting()
        if self._pause > 0 or (self.governor is not None and not self.governor.use_spec(len(running))):
            return [0] * len(running)
        rids = [st.req.rid for st in running]
        raw = self.budgets.step_budgets(rids, len(running))
        out = []
        for st, b in zip(running, raw):
            left = st.req.sampling.max_new_tokens - len(st.output) - 1
            room = self.max_context_len - len(st.tokens)
            out.append(max(0, min(int(b), self.config.num_draft_tokens, left, room)))
        return out

    def select(self, running: list[RequestState], prefill: int, started: float) -> Selection:
        """Draft, cut and pack the trees of a step that also carries ``prefill`` merged prefill tokens;
        ``started`` is the step's ``time.perf_counter()`` start (the drafting time is measured from it)."""
        budgets = self.step_budgets(running)
        ask = [i for i, b in enumerate(budgets) if b > 0]
        trees: list[tuple[list[int], list[int]] | None] = [None] * len(running)  # None = the root alone
        verified: dict[int, tuple[Draft, list[int]]] = {}
        predicted = 0.0
        if ask:
            limits = [budgets[i] for i in ask]
            got = self.drafter.draft_batch([running[i].req.rid for i in ask], limits)
            theta, scores, probs = self._cut_scores(got, limits, len(running), prefill)
            for i, d, sc, pr in zip(ask, got, scores, probs):
                if len(d):
                    toks, pars, kept = pack_draft(d, budgets[i], self.vocab_size, theta, sc)
                    if len(toks) > 1:
                        trees[i] = (toks, pars)
                        verified[i] = (d, kept)
                        predicted += 0.0 if pr is None else float(pr[kept].sum())
        tb = TreeBatch.build(trees, [st.tokens[-1] for st in running])
        if ask:
            self._draft_s = 0.9 * self._draft_s + 0.1 * (time.perf_counter() - started)
        return Selection(tb, verified, bool(ask), predicted)

    def acceptance_scale(self) -> float:
        """Accepted over predicted verified nodes, decayed, from ``scale_prior`` nodes of ratio 1 (1.0 without the
        governor's settings, i.e. without the cut)."""
        if self.governor is None:
            return 1.0
        prior = self.governor.cfg.scale_prior
        return min(max((self._scale[0] + prior) / (self._scale[1] + prior), SCALE_RANGE[0]), SCALE_RANGE[1])

    def _cut_scores(
        self, drafts: list[Draft], limits: list[int], bsz: int, prefill: int
    ) -> tuple[float, list[list[float] | None], list[np.ndarray | None]]:
        """The cut's threshold, each draft's node scores for ``pack_draft`` (0.0 and None: keep every node) and its
        calibrated path probabilities (None without the cut). Scores: 1.0 for the ``_keep`` most likely nodes of
        the batch by calibrated probability times the acceptance scale (ties in draft and BFS order, so a parent,
        never less likely than its child, comes first), 0.0 for the rest, and the threshold 0.5."""
        theta, scores, probs = 0.0, [None] * len(drafts), [None] * len(drafts)
        if self.cut and self.step_cost.ready:
            flat = self.calibration.calibrate_drafts(drafts, limits)
            splits = np.cumsum([min(len(d), n) for d, n in zip(drafts, limits)])[:-1]
            probs = np.split(flat, splits)
            weighed = np.minimum(flat * self.acceptance_scale(), 1.0)
            order = np.argsort(-weighed, kind="stable")
            k = self._keep(weighed[order], bsz, prefill)
            if k < len(flat):
                keep = np.zeros(len(flat))
                keep[order[:k]] = 1.0
                theta, scores = 0.5, [part.tolist() for part in np.split(keep, splits)]
        return theta, scores, probs

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
            self.stats["draft_pauses"] += self._pause > 0
        else:
            self._pause_len = 1
        gov = self.governor
        if gov is not None and row > 0.0 and math.isfinite(gov.cfg.probe_cost):  # a probe: its best nodes only
            k = min(k, int(gov.cfg.probe_cost * base / row * (self._ramp if gov.trusts_spec(bsz) else 1.0)))
        return max(k, 1)

    def observe(
        self, sel: Selection, walks: list[WalkResult], bsz: int, prefill: int, emitted: int, started: float
    ) -> None:
        """Learn from a finished step: its selection, walks, batch size, merged prefill tokens, tokens emitted and
        ``time.perf_counter()`` start."""
        if not self.speculate:
            return
        seconds = time.perf_counter() - started
        decode_s = max(seconds - self.step_cost.prefill_cost() * prefill, 1e-6)  # less the modelled prefill cost
        if sel.verified:  # what was accepted calibrates the drafted probabilities
            self._learn(sel.verified, walks)
            if sel.predicted > 0.0 and self.governor is not None:
                self._learn_scale(sel, walks, bsz, emitted / decode_s)
        if sel.drafted:  # steps that drafted: a paused step has no drafting work and would bias the fit
            self.step_cost.observe(bsz, sel.tb.num_rows, seconds, prefill=prefill)
        elif self._pause > 0:
            self._pause -= 1
            self.stats["paused_steps"] += 1
        if self.governor is not None:  # measured tokens/s
            self.governor.observe(bsz, sel.drafted, emitted, decode_s)

    def _learn_scale(self, sel: Selection, walks: list[WalkResult], bsz: int, rate: float) -> None:
        """Update the acceptance scale and the ramp from a step the cut weighed, which emitted ``rate`` tokens/s:
        did its accepted nodes pay for its draft rows, at the step model's cost of a row against a plain step's cost
        per token, and was it as fast as the plain steps the governor measured in its bucket?"""
        cfg = self.governor.cfg
        accepted = sum(len(walks[b].accepted_nodes) for b in sel.verified)
        self._scale = [cfg.scale_decay * self._scale[0] + accepted, cfg.scale_decay * self._scale[1] + sel.predicted]
        rows = sel.tb.num_rows - bsz
        paid = accepted * self.step_cost.base_cost(bsz) >= rows * self.step_cost.row_cost() * bsz
        plain = self.governor.plain_rate(bsz)
        paid = paid and (plain is None or rate >= plain)
        self._ramp = min(2.0 * self._ramp, cfg.ramp_max) if paid else max(0.5 * self._ramp, 1.0)

    def _learn(self, verified: dict[int, tuple[Draft, list[int]]], walks: list[WalkResult]) -> None:
        """Teach the calibration this step's verified drafts: request b's ``kept`` draft nodes became its tree
        nodes 1.., of which ``walks[b].accepted_nodes`` were accepted."""
        drafts, seen, hit = [], [], []
        for b, (d, kept) in verified.items():
            flags = np.zeros((2, len(d)), dtype=bool)
            flags[0, kept] = True
            flags[1, [kept[node - 1] for node in walks[b].accepted_nodes]] = True
            drafts.append(d)
            seen.append(flags[0])
            hit.append(flags[1])
        self.calibration.observe_drafts(drafts, np.concatenate(hit), np.concatenate(seen))
