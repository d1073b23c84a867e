"""Test instruments for the engine: a scripted drafter and fixed budgets (they implement the drafting drafter and
budget API, so the verifier can be fed drafts that are deliberately right or deliberately wrong).

Example: ``ScriptedDrafter({"p0": [5, 6, 7]}, branch=2)`` drafts, for a request of prompt "p0" that has generated
``g`` tokens so far, the chain ``[5, 6, 7][len(g):]`` plus, when ``branch`` > 1, sibling nodes with other tokens.
"""

from __future__ import annotations

import contextlib

import numpy as np

from sglang_histospec.drafting import ROOT, Draft, DraftCalibration


class ScriptedDrafter:
    """Drafts the continuation of a fixed reference response per prompt id (a chain, or a small tree whose first
    child at every depth is the reference token and whose other children are ``token + j`` mod vocab).

    With ``wrong_first=True`` the wrong siblings come first in each sibling group (so they are tried first).
    Records ``finish`` calls in ``finished`` (rid -> response).
    """

    def __init__(self, refs: dict[str, list[int]], vocab_size: int = 64, branch: int = 1, wrong_first: bool = False):
        self.refs = refs
        self.vocab_size = vocab_size
        self.branch = branch
        self.wrong_first = wrong_first
        self.reqs: dict[str, tuple[str | None, list[int]]] = {}
        self.finished: dict[str, list[int]] = {}
        self.calibration = DraftCalibration()
        self.open_step = 0

    def start(self, req_id, prompt_id, prompt_tokens):
        self.reqs[req_id] = (prompt_id, [])

    def extend(self, req_id, tokens):
        self.reqs[req_id][1].extend(tokens)

    def extend_batch(self, req_ids, tokens):
        for rid, toks in zip(req_ids, tokens):
            self.extend(rid, toks)

    def draft_batch(self, req_ids, budgets):
        return [self.draft(r, b) for r, b in zip(req_ids, budgets)]

    def draft(self, req_id, budget):
        prompt_id, gen = self.reqs[req_id]
        ref = self.refs.get(prompt_id)
        if ref is None or ref[: len(gen)] != gen:
            return Draft.empty()
        cont = ref[len(gen) :]
        tokens, parents = [], []
        parent = ROOT
        for tok in cont:
            group = [(tok + j) % self.vocab_size for j in range(self.branch)]
            if self.wrong_first:
                group = group[1:] + group[:1]
            first_real = None
            for t in group:
                if len(tokens) >= budget:
                    break
                tokens.append(t)
                parents.append(parent)
                if t == tok:
                    first_real = len(tokens) - 1
            if first_real is None or len(tokens) >= budget:
                break
            parent = first_real
        # BFS order: each group's nodes share a parent and groups go deeper, so the order is already BFS
        return Draft(
            token_ids=tokens, parents=parents, probs=[1.0] * len(tokens), match_len=len(gen), source="history"
        )

    def finish(self, req_id, response):
        self.finished[req_id] = list(response)
        self.reqs.pop(req_id, None)

    def abort(self, req_id):
        self.reqs.pop(req_id, None)

    def add(self, prompt_id, step, responses, rewards=None, prompt_tokens=None):
        return 0  # no history: the drafts come from ``refs``

    def end_step(self, step=None):
        self.open_step = (self.open_step if step is None else step) + 1

    def stats(self):
        return {"requests": len(self.reqs)}


class FixedBudgets:
    """Every request gets the same budget."""

    def __init__(self, budget: int):
        self.budget = budget

    def step_budgets(self, req_ids, batch_size):
        return [self.budget] * len(req_ids)

    def update(self, req_id, drafted, accepted):
        pass

    def remove(self, req_id):
        pass


def reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Independent numpy reference: softmax(l / T), top-k renorm, then top-p renorm (greedy: softmax(l))."""
    t = 1.0 if temperature == 0 else temperature
    p = np.exp((logits - logits.max()) / t)
    p /= p.sum()
    if temperature == 0:
        return p
    if 0 < top_k < len(p):
        keep = np.argsort(-p, kind="stable")[:top_k]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        n_keep = int(np.searchsorted(cum, top_p) + 1)  # smallest prefix whose mass reaches top_p
        q = np.zeros_like(p)
        q[order[:n_keep]] = p[order[:n_keep]]
        p = q / q.sum()
    return p


@contextlib.contextmanager
def torch_threads(n: int = 1):
    """Run torch on ``n`` CPU threads inside the block (tiny models gain nothing from more, and on a loaded
    machine OpenMP barriers across threads cost far more than they save)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
