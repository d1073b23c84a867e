"""The host cost of drafting on a real trace: ``draft_batch`` at a GPU batch, beside SGLang NGRAM's ``batch_get``.

History is every step of the trace before the last; ``batch`` requests of the last step (cycling through its records)
start at random positions of their responses. Each round drafts the whole batch (timed), commits what the draft
would have had accepted plus the bonus token (``extend_batch``, timed), and, with the peers installed, gives the same
windows to NGRAM (``batch_get``, then ``batch_put`` of the same windows, timed). A request that reaches its response's
end restarts at a new random position (not timed). Semantics of every key: docs/results.md, "Draft cost".

Example::

    res = run_draft_bench(load_steps("docs/data/smollm2-ledger.jsonl.gz")[0], DraftBenchConfig(batch=64, rounds=8))
    res.to_json()["draft_us_p50"]
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field, replace

import numpy as np

from sglang_histospec.drafting.drafter import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.types import Draft
from sglang_histospec.replay.drafters.peers import PeerUnavailable
from sglang_histospec.replay.simulator import accept_length
from sglang_histospec.trace.format import TraceRecord, TraceStep

NGRAM_WINDOW = 18
"""Context tokens NGRAM matches and inserts per step (SGLang's ``--speculative-ngram-max-trie-depth`` default)."""


@dataclass(slots=True)
class DraftBenchConfig:
    """What ``histospec bench draft`` measures."""

    batch: int = 256
    """Concurrent requests drafted per call."""
    budget: int = 8
    """Draft nodes per request."""
    rounds: int = 40
    """Timed rounds (each drafts the whole batch once)."""
    warmup: int = 4
    """Untimed rounds first (the re-ranker learns, buffers grow)."""
    draft_threads: int = 2
    """Threads of a second drafter timed on the same windows in the same rounds (1: no second drafter)."""
    ngram: bool = True
    """Also time SGLang NGRAM on the same windows when it is installed."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("batch", 1), ("budget", 1), ("rounds", 1), ("warmup", 0), ("draft_threads", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DraftBenchConfig.{name}={value!r}: expected an int >= {low}")


@dataclass(slots=True)
class DraftBenchResult:
    """Timings in microseconds per call (a call covers the whole batch) unless named per request."""

    cfg: DraftBenchConfig
    history_tokens: int
    mean_response: float
    draft_call_us: list[float] = field(default_factory=list)
    draft_call_us_threads: list[float] = field(default_factory=list)
    extend_call_us: list[float] = field(default_factory=list)
    ngram_get_us: list[float] = field(default_factory=list)
    ngram_put_us: list[float] = field(default_factory=list)
    ngram_error: str | None = None
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    digest: object = field(default_factory=hashlib.sha1)
    """Of every timed draft of the one-thread drafter (tokens, parents, probs): equal digests, equal drafts."""

    def to_json(self) -> dict:
        b = self.cfg.batch
        out: dict = {
            "batch": b,
            "budget": self.cfg.budget,
            "threads": 1,
            "rounds": len(self.draft_call_us),
            "history_tokens": self.history_tokens,
            "mean_response_tokens": round(self.mean_response, 1),
            "draft_call_us_p50": _pct(self.draft_call_us, 50),
            "draft_call_us_p99": _pct(self.draft_call_us, 99),
            "draft_us_p50": _pct(self.draft_call_us, 50, b),
            "draft_us_p99": _pct(self.draft_call_us, 99, b),
            "extend_us_p50": _pct(self.extend_call_us, 50),
            "extend_us_p99": _pct(self.extend_call_us, 99),
            "tau": round((self.accepted + self.verify_steps) / max(self.verify_steps, 1), 4),
            "drafted_per_request": round(self.drafted / max(self.verify_steps, 1), 3),
            "drafts_sha1": self.digest.hexdigest(),
            "load_avg_1min": round(os.getloadavg()[0], 2),
        }
        if self.draft_call_us_threads:
            out["draft_threads"] = self.cfg.draft_threads
            out["draft_call_us_p50_threads"] = _pct(self.draft_call_us_threads, 50)
            out["draft_call_us_p99_threads"] = _pct(self.draft_call_us_threads, 99)
        if self.ngram_get_us:
            get, put = _pct(self.ngram_get_us, 50), _pct(self.ngram_put_us, 50)
            out["ngram_batch_get_us_p50"] = get
            out["ngram_batch_get_us_p99"] = _pct(self.ngram_get_us, 99)
            out["ngram_batch_get_us_p50_per_request"] = _pct(self.ngram_get_us, 50, b)
            out["ngram_batch_put_us_p50"] = put
            out["ratio"] = round(out["draft_call_us_p50"] / get, 4) if get else None
            out["extend_ratio"] = round(out["extend_us_p50"] / put, 4) if put else None
        if self.ngram_error:
            out["ngram_unavailable"] = self.ngram_error
        return out


def _pct(values: list[float], q: float, per: int = 1) -> float | None:
    return round(float(np.percentile(values, q)) / per, 3) if values else None


class _Ngram:
    """SGLang NGRAM's corpus driven per round as its worker drives it: ``batch_get`` of each request's last
    ``NGRAM_WINDOW`` tokens, then ``batch_put`` of the same windows; ``erase_match_state`` on a restart."""

    def __init__(self, budget: int) -> None:
        from sglang_histospec.replay.drafters.sglang_ngram import SGLangNgramDrafter

        self.corpus = SGLangNgramDrafter(budget).corpus

    def put_all(self, contexts: list[list[int]], chunk: int = 4096) -> None:
        """The windows a decode of each context would have put, one per position (the corpus before the step)."""
        windows = [c[max(0, i - NGRAM_WINDOW) : i] for c in contexts for i in range(1, len(c) + 1)]
        for k in range(0, len(windows), chunk):
            self.corpus.batch_put(windows[k : k + chunk])
            self.corpus.synchronize()

    def get(self, ids: list[str], ctxs: list[list[int]]) -> tuple[list[list[int]], float]:
        windows = [c[-NGRAM_WINDOW:] for c in ctxs]
        self.corpus.synchronize()
        t0 = time.perf_counter()
        self.corpus.batch_get(ids, windows, [len(c) for c in ctxs])
        return windows, (time.perf_counter() - t0) * 1e6

    def put(self, windows: list[list[int]]) -> float:
        t0 = time.perf_counter()
        self.corpus.batch_put(windows)
        self.corpus.synchronize()
        return (time.perf_counter() - t0) * 1e6

    def erase(self, req_id: str) -> None:
        self.corpus.erase_match_state([req_id])


def _history(steps: list[TraceStep], drafters: list[HistoSpecDrafter]) -> int:
    """Every step but the last pushed into each drafter, as the trainer pushes it; the tokens pushed."""
    total = 0
    for st in steps[:-1]:
        groups: dict[str, list[TraceRecord]] = {}
        for rec in st.records:
            groups.setdefault(rec.prompt_id, []).append(rec)
        for pid, recs in groups.items():
            recs.sort(key=lambda r: r.sample)
            rewards = None if any(r.reward is None for r in recs) else [float(r.reward) for r in recs]
            for d in drafters:
                d.add(pid, st.step, [r.response for r in recs], rewards, prompt_tokens=recs[0].prompt)
            total += sum(len(r.response) for r in recs)
        for d in drafters:
            d.end_step(st.step)
    return total


class _Requests:
    """The batch: request i replays record ``records[i % len(records)]`` from a random position on."""

    def __init__(self, records: list[TraceRecord], cfg: DraftBenchConfig, drafters: list[HistoSpecDrafter]) -> None:
        self.records = [r for r in records if len(r.response) >= 2]
        if not self.records:
            raise ValueError("the trace's last step has no response of 2 or more tokens: nothing to draft")
        self.rng = np.random.default_rng(cfg.seed)
        self.drafters = drafters
        self.ids = [f"bench-{i}" for i in range(cfg.batch)]
        self.rec = [self.records[i % len(self.records)] for i in range(cfg.batch)]
        self.pos = [0] * cfg.batch
        self.serial = [0] * cfg.batch
        for i in range(cfg.batch):
            self._begin(i)

    def _begin(self, i: int) -> None:
        rec = self.rec[i]
        self.pos[i] = int(self.rng.integers(0, len(rec.response) - 1))
        self.ids[i] = f"bench-{i}-{self.serial[i]}"
        self.serial[i] += 1
        for d in self.drafters:
            d.start(self.ids[i], rec.prompt_id, rec.prompt)
            if self.pos[i]:
                d.extend(self.ids[i], rec.response[: self.pos[i]])

    def context(self, i: int) -> list[int]:
        return self.rec[i].prompt + self.rec[i].response[: self.pos[i]]

    def commits(self, drafts: list[Draft]) -> tuple[list[list[int]], int]:
        """Per request the tokens a verify step commits (accepted nodes plus the bonus token); accepted total."""
        out, accepted = [], 0
        for i, d in enumerate(drafts):
            resp = self.rec[i].response
            k = accept_length(d, resp, self.pos[i]) if len(d) else 0
            accepted += k
            out.append(resp[self.pos[i] : min(self.pos[i] + k + 1, len(resp))])
        return out, accepted

    def advance(self, commits: list[list[int]], ngram: _Ngram | None) -> None:
        for i, toks in enumerate(commits):
            self.pos[i] += len(toks)
            if self.pos[i] >= len(self.rec[i].response) - 1:  # restart elsewhere, untimed
                for d in self.drafters:
                    d.abort(self.ids[i])
                if ngram is not None:
                    ngram.erase(self.ids[i])
                self.rec[i] = self.records[int(self.rng.integers(0, len(self.records)))]
                self._begin(i)
                if ngram is not None:
                    ngram.put_all([self.context(i)])


def _timed(fn, *args) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e6


def run_draft_bench(steps: list[TraceStep], cfg: DraftBenchConfig, drafter_cfg: DrafterConfig | None = None,
                    progress=None) -> DraftBenchResult:  # fmt: skip
    """Time ``draft_batch`` / ``extend_batch`` (and NGRAM's ``batch_get`` / ``batch_put``) on ``steps``."""
    if len(steps) < 2:
        raise ValueError(f"the trace has {len(steps)} step(s): bench draft needs history (>= 2 steps)")
    say = progress or (lambda msg: None)
    base = drafter_cfg or DrafterConfig()
    drafters = [HistoSpecDrafter(replace(base, draft_threads=1))]
    if cfg.draft_threads > 1:
        drafters.append(HistoSpecDrafter(replace(base, draft_threads=cfg.draft_threads)))
    history = _history(steps, drafters)
    responses = [len(r.response) for st in steps for r in st.records]
    res = DraftBenchResult(cfg, history, float(np.mean(responses)))
    say(f"history: {history:,} tokens over {len(steps) - 1} steps; mean response {res.mean_response:.0f} tokens")
    reqs = _Requests(steps[-1].records, cfg, drafters)
    ngram = _make_ngram(cfg, res)
    if ngram is not None:
        say("NGRAM: putting every history window into its corpus")
        ngram.put_all([r.prompt + r.response for st in steps[:-1] for r in st.records])
        ngram.put_all([reqs.context(i) for i in range(cfg.batch)])
    budgets = [cfg.budget] * cfg.batch
    for rnd in range(cfg.warmup + cfg.rounds):
        timed = rnd >= cfg.warmup
        drafts, us = _timed(drafters[0].draft_batch, list(reqs.ids), budgets)
        if len(drafters) > 1:
            _, us_t = _timed(drafters[1].draft_batch, list(reqs.ids), budgets)
        commits, accepted = reqs.commits(drafts)
        _, extend_us = _timed(drafters[0].extend_batch, list(reqs.ids), commits)
        for d in drafters[1:]:
            d.extend_batch(list(reqs.ids), commits)
        if ngram is not None:
            windows, get_us = ngram.get(list(reqs.ids), [reqs.context(i) for i in range(cfg.batch)])
            put_us = ngram.put(windows)
        if timed:
            res.draft_call_us.append(us)
            res.extend_call_us.append(extend_us)
            if len(drafters) > 1:
                res.draft_call_us_threads.append(us_t)
            if ngram is not None:
                res.ngram_get_us.append(get_us)
                res.ngram_put_us.append(put_us)
            res.drafted += sum(len(d) for d in drafts)
            for d in drafts:
                res.digest.update(repr((d.token_ids, d.parents, d.probs)).encode())
            res.accepted += accepted
            res.verify_steps += cfg.batch
        reqs.advance(commits, ngram)
        if (rnd + 1) % 10 == 0:
            say(f"round {rnd + 1}/{cfg.warmup + cfg.rounds}: draft {us / 1e3:.2f} ms per call")
    return res


def _make_ngram(cfg: DraftBenchConfig, res: DraftBenchResult) -> _Ngram | None:
    if not cfg.ngram:
        return None
    try:
        return _Ngram(cfg.budget)
    except PeerUnavailable as e:
        res.ngram_error = str(e)
        return None
