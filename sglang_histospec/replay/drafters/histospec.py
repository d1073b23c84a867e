"""``HistoSpecDrafter`` behind the replay interface, with per-request budgets from ``BudgetController``.

It drives the facade exactly as the engine integration does (:class:`HistoSpecReplayDrafter`);
``rhymerl_drafter(budget)`` is RhymeRL's released policy (docs/replay.md section 7).

Example::

    d = HistoSpecReplayDrafter(DrafterConfig(backend="python"), budget_policy="fixed")
    replay(steps, d, ReplayConfig(budget=8))
"""

from __future__ import annotations

import numpy as np

from sglang_histospec.drafting.budget import BudgetConfig, BudgetController
from sglang_histospec.drafting.drafter import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.drafting.types import Draft, accepted_path
from sglang_histospec.replay.simulator import BaseDrafter

BUDGET_POLICIES = ("fixed", "paper", "released")


def budget_config(policy: str, cap: int) -> BudgetConfig | None:
    """The AIMD controller for ``policy`` with its window capped at the replay budget (None = fixed)."""
    if policy not in BUDGET_POLICIES:
        raise ValueError(f"budget policy {policy!r}: expected one of {BUDGET_POLICIES}")
    if policy == "fixed" or cap < 2:
        return None
    if policy == "paper":
        return BudgetConfig.paper(max_budget=min(32, cap), cost_limit=None)
    return BudgetConfig.released(max_budget=min(16, cap), cost_limit=None)


class HistoSpecReplayDrafter(BaseDrafter):
    """Our drafter; ``sources`` and ``window`` come from its config (the oracle uses the same).

    The replay drives the facade exactly as the engine integration does: ``start`` with the prompt and prompt id,
    ``draft`` / ``extend`` per verify step, ``finish`` with the whole response (a sibling at once), and at the end
    of the step one ``add(prompt_id, step, responses, rewards, prompt_tokens)`` per prompt (the trainer's push,
    with rewards) followed by ``end_step(step)``; the facade never counts a pushed step twice.
    """

    def __init__(
        self, cfg: DrafterConfig, budget_policy: str = "fixed", cap: int = 8, name: str = "histospec"
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.drafter: Drafter = HistoSpecDrafter(cfg)
        self.sources = tuple(cfg.sources)
        self.window = cfg.window
        self.live_global = False
        bcfg = budget_config(budget_policy, cap)
        self.budgets = BudgetController(bcfg) if bcfg is not None else None
        self._depth: dict[str, int] = {}
        self._last: dict[str, Draft] = {}  # the request's last draft, verified by the next extend
        self._pending: list[tuple[Draft, list[int]]] | None = None  # batched rounds: (draft, tokens) to learn
        self._cal = {"nodes": 0, "accepted": 0, "raw": 0.0, "calibrated": 0.0, "brier_raw": 0.0, "brier_cal": 0.0}

    def start(self, req_id: str, prompt_id: str, prompt: list[int]) -> None:
        self.drafter.start(req_id, prompt_id, prompt)

    def extend(self, req_id: str, tokens: list[int]) -> None:
        d = self._last.pop(req_id, None)
        if d is not None and len(d):
            if self._pending is None:
                self._calibrate([d], [tokens])
            else:
                self._pending.append((d, tokens))
        self.drafter.extend(req_id, tokens)

    def end_round(self) -> None:
        if self._pending:
            drafts, tokens = zip(*self._pending)
            self._calibrate(list(drafts), list(tokens))
            self._pending.clear()

    def _calibrate(self, drafts: list[Draft], tokens: list[list[int]]) -> None:
        """Score the calibration's predictions for these drafts, then teach it what each one's ``tokens`` accepted
        (one draft at a time, or a batched round's drafts together as the engine learns a step's)."""
        cal = self.drafter.calibration
        raw = np.asarray([p for d in drafts for p in d.probs], dtype=np.float64)
        pred = cal.calibrate_drafts(drafts)
        hit = np.zeros(len(raw), dtype=bool)
        at = 0
        for d, toks in zip(drafts, tokens):
            hit[[at + i for i in accepted_path(d.token_ids, d.parents, toks)]] = True
            at += len(d)
        cal.observe_drafts(drafts, hit)
        c = self._cal
        c["nodes"] += len(raw)
        c["accepted"] += int(hit.sum())
        c["raw"] += float(raw.sum())
        c["calibrated"] += float(pred.sum())
        c["brier_raw"] += float(((raw - hit) ** 2).sum())
        c["brier_cal"] += float(((pred - hit) ** 2).sum())

    def calibration_report(self) -> dict:
        """Drafted nodes, accepted, and the mean predicted acceptance and Brier score of the raw and the
        calibrated (predicted before each outcome was learnt) path probabilities."""
        c, n = self._cal, max(self._cal["nodes"], 1)
        return {
            "nodes": c["nodes"],
            "accept_rate": round(c["accepted"] / n, 6),
            "mean_raw": round(c["raw"] / n, 6),
            "mean_calibrated": round(c["calibrated"] / n, 6),
            "brier_raw": round(c["brier_raw"] / n, 6),
            "brier_calibrated": round(c["brier_cal"] / n, 6),
        }

    def draft(self, req_id: str, budget: int) -> Draft:
        d = self.drafter.draft_batch([req_id], [budget])[0]
        self.verified(req_id, d)
        return d

    def draft_round(self, req_ids: list[str], budgets: list[int]) -> list[Draft]:
        if self._pending is None:
            self._pending = []
        drafts = self.drafter.draft_batch(req_ids, budgets)
        for r, d in zip(req_ids, drafts):
            self.verified(r, d)
        return drafts

    def verified(self, req_id: str, draft: Draft) -> None:
        self._last[req_id] = draft
        if self.budgets is not None:
            self._depth[req_id] = max(draft.depths(), default=0)

    def budget(self, req_id: str, cap: int) -> int:
        return cap if self.budgets is None else min(cap, self.budgets.get(req_id))

    def observe(self, req_id: str, drafted: int, accepted: int) -> None:
        if self.budgets is not None:
            self.budgets.update(req_id, self._depth.pop(req_id, 0), accepted)

    def finish(self, req_id: str, response: list[int]) -> None:
        self._last.pop(req_id, None)
        self.drafter.finish(req_id, response)
        if self.budgets is not None:
            self.budgets.remove(req_id)

    def end_step(self, step: int, groups: list[tuple[str, list[int], list[list[int]], list[float] | None]]) -> None:
        for prompt_id, prompt, responses, rewards in groups:
            self.drafter.add(prompt_id, step, responses, rewards, prompt_tokens=prompt)
        self.drafter.end_step(step)


def rhymerl_drafter(cap: int, **overrides) -> HistoSpecReplayDrafter:
    """RhymeRL's released policy (chain, match 7..4, min prob 0.1, previous epoch, 5 prompt tokens, x2 / /2)."""
    return HistoSpecReplayDrafter(DrafterConfig.rhymerl(**overrides), "released", cap, name="rhymerl")
