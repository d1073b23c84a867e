"""The bridge between SGLang's NGRAM worker and the history drafter; pure Python, no SGLang import.

``HistorySpecCorpus`` gives every request of a batch exactly ``N = --speculative-num-draft-tokens`` draft nodes in
SGLang's tree layout and records finished responses as history (layout and call order: its class docstring;
docs/sglang.md, "How it works"). Example::

    corpus = HistorySpecCorpus(AdapterConfig(num_draft_tokens=4))
    corpus.push(step=0, entries=[("p1", [[5, 6, 7, 8]], None)])
    corpus.observe("r1", "p1", prompt_tokens=[1, 2], output_tokens=[5])
    tokens, mask = corpus.draft_batch(["r1"])   # tokens == [5, 6, 7, 8] (root 5, then the chain 6 -> 7 -> 8)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sglang_histospec.drafting import Draft, DrafterConfig, HistoSpecDrafter, pack_draft
from sglang_histospec.drafting.prompt_ids import PROMPT_ID_KEY as PROMPT_ID_KEY  # the old import path
from sglang_histospec.drafting.prompt_ids import prompt_id_for
from sglang_histospec.drafting.protocol import Drafter

prompt_key = prompt_id_for
"""The history key of a request (the old name of :func:`~sglang_histospec.drafting.prompt_ids.prompt_id_for`)."""


DRAFTER_CONFIG_ENV = "HISTOSPEC_DRAFTER_CONFIG"
"""Optional JSON object of :class:`~sglang_histospec.drafting.DrafterConfig` fields for the plugin's drafter."""


def drafter_config_from_env(environ: Mapping[str, str] | None = None) -> DrafterConfig:
    """The drafter configuration from ``$HISTOSPEC_DRAFTER_CONFIG`` (JSON), defaults otherwise."""
    raw = (os.environ if environ is None else environ).get(DRAFTER_CONFIG_ENV, "").strip()
    if not raw:
        return DrafterConfig()
    try:
        fields = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f'${DRAFTER_CONFIG_ENV} is not JSON ({exc}); give an object such as {{"window": 2}}') from exc
    if not isinstance(fields, dict):
        raise ValueError(f"${DRAFTER_CONFIG_ENV}={raw!r}; give a JSON object of DrafterConfig fields")
    if isinstance(fields.get("sources"), list):
        fields["sources"] = tuple(fields["sources"])
    try:
        return DrafterConfig(**fields)
    except TypeError as exc:
        raise ValueError(f"${DRAFTER_CONFIG_ENV}: {exc}; use DrafterConfig field names") from exc


@dataclass
class AdapterConfig:
    """How the SGLang worker drives the drafter."""

    num_draft_tokens: int
    """N: nodes per request including the root (SGLang's ``--speculative-num-draft-tokens``)."""
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    """Configuration of the history drafter (window, match lengths, tree/chain, sources...)."""
    record_truncated: bool = True
    """Record responses that stopped at ``max_new_tokens`` (RL keeps clipped responses); aborts are never kept."""
    max_prompt_tokens: int = 0
    """Tokens of the prompt given to the drafter (0 = all); only its tail is ever matched."""

    def __post_init__(self) -> None:
        if not isinstance(self.num_draft_tokens, int) or self.num_draft_tokens < 2:
            raise ValueError(f"num_draft_tokens={self.num_draft_tokens!r}; use an int >= 2 (root + at least 1 draft)")
        if self.max_prompt_tokens < 0:
            raise ValueError(f"max_prompt_tokens={self.max_prompt_tokens}; use 0 (all) or a positive count")


@dataclass
class _Live:
    prompt_id: str
    known: int  # committed output tokens already given to the drafter
    last: int  # the last committed token (prompt's last token before any output)
    draft: Draft | None = None  # the last draft sent to SGLang, verified by the next committed tokens


class HistorySpecCorpus:
    """Per-request drafting state over one ``HistoSpecDrafter`` (the module docstring has an example).

    SGLang's NGRAM verify path wants, for a batch of ``bs`` requests, exactly ``N`` draft nodes per request
    (``N = --speculative-num-draft-tokens``): a flat ``int64[bs * N]`` array of tokens (node 0 = the last committed
    token, then BFS order, padding = token 0 as a child of node 0) and a flat ``bool[bs * N * N]`` ancestor-or-self
    mask. ``HistorySpecCorpus`` keeps one drafter request per SGLang request, feeds it the tokens committed since the
    last step, drafts the whole batch with one call, and records finished responses as history for their prompt.

    Every method is called from the scheduler loop (never from a thread), so with tensor parallelism every rank sees
    the same calls in the same order and drafts identically.
    """

    def __init__(self, config: AdapterConfig, drafter: Drafter | None = None) -> None:
        self.config = config
        self.drafter: Drafter = drafter if drafter is not None else HistoSpecDrafter(config.drafter)
        self._live: dict[str, _Live] = {}
        self.counters = {"requests": 0, "recorded": 0, "skipped_aborted": 0, "pushed": 0, "steps_closed": 0}

    # ---- per-request state -------------------------------------------------------------------------------
    def observe(self, rid: str, prompt_id: str | None, prompt_tokens: Sequence[int], output_tokens: Sequence[int]):
        """Bring request ``rid`` up to date: ``output_tokens`` are all tokens it has committed so far."""
        if not prompt_tokens:
            raise ValueError(f"request {rid!r} has an empty prompt; SGLang requests always have >= 1 token")
        live = self._live.get(rid)
        n_out = len(output_tokens)
        if live is not None and (
            n_out < live.known or (n_out and live.known and output_tokens[live.known - 1] != live.last)
        ):
            # The request was retracted or resumed with a different output: start again.
            self.drafter.abort(rid)
            live = None
        if live is None:
            tokens = list(prompt_tokens)
            if self.config.max_prompt_tokens:
                tokens = tokens[-self.config.max_prompt_tokens :]
            self.drafter.start(rid, prompt_id, tokens)
            live = _Live(prompt_id=prompt_id or "", known=0, last=int(prompt_tokens[-1]))
            self._live[rid] = live
            self.counters["requests"] += 1
        if n_out > live.known:
            new = [int(t) for t in output_tokens[live.known :]]
            if live.draft is not None:  # what SGLang accepted of our last draft teaches the drafter's calibration
                self.drafter.calibration.observe_tokens(live.draft, new)
                live.draft = None
            self.drafter.extend(rid, new)
            live.known = n_out
            live.last = new[-1]

    def draft_batch(self, rids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Drafts for ``rids`` (all observed) in SGLang's layout: tokens ``int64[bs*N]``, mask ``bool[bs*N*N]``."""
        n = self.config.num_draft_tokens
        bs = len(rids)
        tokens = np.zeros((bs, n), dtype=np.int64)
        mask = np.zeros((bs, n, n), dtype=bool)
        if bs == 0:
            return tokens.reshape(-1), mask.reshape(-1)
        missing = [r for r in rids if r not in self._live]
        if missing:
            raise ValueError(f"draft_batch: requests {missing[:3]} were never observed; call observe() first")
        drafts = self.drafter.draft_batch(list(rids), [n - 1] * bs)
        for b, (rid, draft) in enumerate(zip(rids, drafts)):
            live = self._live[rid]
            packed = pack_draft(draft, live.last, n)
            real = min(len(draft), n - 1)  # the BFS prefix pack_draft kept
            live.draft = Draft(draft.token_ids[:real], draft.parents[:real], draft.probs[:real],
                               draft.match_len, draft.source) if real else None  # fmt: skip
            tokens[b] = packed.tokens
            mask[b] = packed.mask
        return tokens.reshape(-1), mask.reshape(-1)

    def finish(self, rid: str, output_tokens: Sequence[int] | None, *, aborted: bool, truncated: bool) -> bool:
        """Request ``rid`` ended; record its response unless aborted (or truncated and not recorded). -> recorded."""
        live = self._live.pop(rid, None)
        if live is None:
            return False
        keep = output_tokens is not None and not aborted and (self.config.record_truncated or not truncated)
        if not keep:
            self.drafter.abort(rid)
            self.counters["skipped_aborted"] += 1
            return False
        self.drafter.finish(rid, [int(t) for t in output_tokens])
        self.counters["recorded"] += 1
        return True

    def forget_requests(self) -> None:
        """Drop all per-request state (the history stays): SGLang flushed its cache or restarted requests."""
        for rid in list(self._live):
            self.drafter.abort(rid)
        self._live.clear()

    # ---- history -------------------------------------------------------------------------------------------
    def push(self, step: int, entries: Sequence[tuple]) -> int:
        """Add pushed responses for training step ``step``. -> responses added.

        Each entry is ``(prompt_id, responses, rewards)`` or ``(prompt_id, responses, rewards, prompt_tokens)``;
        ``rewards`` and ``prompt_tokens`` may be None.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step={step!r}; use an int >= 0")
        added = 0
        for entry in entries:
            if len(entry) not in (3, 4):
                raise ValueError(f"history entry {entry!r:.80}; use (prompt_id, responses, rewards[, prompt_tokens])")
            prompt_id, responses, rewards = entry[:3]
            prompt_tokens = entry[3] if len(entry) == 4 else None
            added += self.drafter.add(str(prompt_id), step, responses, rewards, prompt_tokens=prompt_tokens)
        self.counters["pushed"] += added
        return added

    def end_step(self, step: int | None = None) -> None:
        """Close the open step: the responses recorded by the server become history."""
        self.drafter.end_step(step)
        self.counters["steps_closed"] += 1

    def stats(self) -> dict[str, Any]:
        out = dict(self.drafter.stats())
        out.update({f"adapter_{k}": v for k, v in self.counters.items()})
        out["live_requests"] = len(self._live)
        out["num_draft_tokens"] = self.config.num_draft_tokens
        out["calibration"] = self.drafter.calibration.by_source()
        return out
