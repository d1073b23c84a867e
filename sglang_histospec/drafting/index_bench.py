"""Synthetic benchmark of a history-index backend (``histospec bench index``); numpy only, no engine.

It drives the backend interface of ``docs/drafting.md`` section 9 directly (``set_history``, ``start``,
``extend``, ``draft_batch``), which is what the facade calls after validating its input.

Example::

    >>> from sglang_histospec.drafting.index_bench import IndexBenchConfig, run_index_bench
    >>> r = run_index_bench(IndexBenchConfig(prompts=2, responses=4, length=64, steps=4), backend="python")
    >>> r["history_tokens_per_prompt"], r["batch"]
    (272, 2)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sglang_histospec.drafting.reference import ReferenceIndex
from sglang_histospec.drafting.types import WEIGHT_ONE, accepted_length, tau

PROMPT_LEN = 16
"""Prompt length of every synthetic prompt."""
PROMPT_TAIL = 4
"""Prompt tokens placed before every history response (DrafterConfig.prompt_tail's default)."""


@dataclass(slots=True)
class IndexBenchConfig:
    """Shape of the synthetic workload; every field is a flag of ``histospec bench index``."""

    prompts: int = 256
    """Prompts; one decoding request per prompt, so also the batch size."""
    responses: int = 16
    """History responses per prompt."""
    length: int = 8192
    """Tokens per response."""
    similarity: float = 0.9
    """Per-token probability that a response copies its prompt's base response (else a random token)."""
    vocab: int = 32000
    """Token ids lie in [0, vocab)."""
    budget: int = 16
    """Draft budget per request-step."""
    steps: int = 64
    """Decode steps measured."""
    sources: tuple[str, ...] = ("history", "siblings", "self")
    """Draft sources."""
    tree: bool = True
    """Tree (True) or chain drafts."""
    seed: int = 0
    """Seed of the generator."""
    min_match: int = 1
    """DrafterConfig.min_match."""
    max_match: int = 32
    """DrafterConfig.max_match."""
    min_prob: float = 0.1
    """DrafterConfig.min_prob."""
    scorer: str = "anchors"
    """DrafterConfig.scorer: "anchors" (learnt anchor rates) or "counts" (the longest match's counts)."""
    draft_threads: int = 2
    """DrafterConfig.draft_threads of the native backend: odd steps draft on this many threads, even steps on one."""


def _make_backend(cfg: IndexBenchConfig, backend: str):
    if cfg.scorer == "anchors":
        return _make_anchor_backend(cfg, backend)
    kwargs = dict(
        min_match=cfg.min_match,
        max_match=cfg.max_match,
        tree=cfg.tree,
        min_prob=cfg.min_prob,
        use_frequency=True,
        sources=cfg.sources,
    )
    if backend == "python":
        return ReferenceIndex(**kwargs)
    from sglang_histospec.drafting.native import NativeIndex

    return NativeIndex(**kwargs, draft_threads=cfg.draft_threads)


def _make_anchor_backend(cfg: IndexBenchConfig, backend: str):
    kwargs = dict(min_match=cfg.min_match, max_match=cfg.max_match, prompt_tail=PROMPT_TAIL, sources=cfg.sources)
    if backend == "python":
        from sglang_histospec.drafting.anchors import AnchorIndex

        return AnchorIndex(**kwargs)
    from sglang_histospec.drafting.native_anchors import NativeAnchorIndex

    return NativeAnchorIndex(**kwargs, draft_threads=cfg.draft_threads)


def _sample(base: np.ndarray, similarity: float, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """A response that copies ``base`` token by token with probability ``similarity``."""  # [len(base)] int32
    noise = rng.integers(0, vocab, size=base.shape, dtype=np.int32)
    return np.where(rng.random(base.shape) < similarity, base, noise).astype(np.int32)


@dataclass(slots=True)
class _Ingested:
    """The synthetic history once in the backend, and what the decode phase replays against it."""

    prompts: list[np.ndarray]
    """Per prompt: its PROMPT_LEN token ids."""
    truths: list[np.ndarray]
    """Per prompt: the response its request decodes (the bench's ground truth)."""
    history_tokens: int = 0
    ingest_s: float = 0.0
    ingest_cpu_s: float = 0.0
    memory: int = 0
    """Backend bytes the history added."""


@dataclass(slots=True)
class _Timings:
    """What the steps drafted on one setting of threads measured."""

    per_request_us: list[float] = field(default_factory=list)
    """Wall time of one request's draft, per request-step."""
    step_ms: list[float] = field(default_factory=list)
    """Wall time of a whole ``draft_batch`` call (the batch's drafts, as Python objects), per step."""
    call_us: list[float] = field(default_factory=list)
    """The same divided by the batch size, per step."""
    cpu_s: float = 0.0
    """CPU time of the calling thread in those calls."""
    request_steps: int = 0


@dataclass(slots=True)
class _Decoded:
    """What the decode phase measured: ``one`` over the steps drafted on one thread, ``many`` over those drafted
    on ``draft_threads`` threads (the drafts, hence the decode, do not depend on it)."""

    one: _Timings = field(default_factory=_Timings)
    many: _Timings = field(default_factory=_Timings)
    emitted: int = 0
    request_steps: int = 0


def _ingest(
    index, cfg: IndexBenchConfig, rng: np.random.Generator, say: Callable[[str], None], backend: str
) -> _Ingested:
    """Draw every prompt, its history (``set_history``, timed) and its ground-truth response."""
    base_memory = index.memory_bytes()
    out = _Ingested([], [])
    say(f"{backend}: ingest {cfg.prompts} prompts x {cfg.responses} responses x {cfg.length} tokens")
    for p in range(cfg.prompts):
        prompt = rng.integers(0, cfg.vocab, size=PROMPT_LEN, dtype=np.int32)
        base = (rng.zipf(1.1, size=cfg.length) % cfg.vocab).astype(np.int32)
        tail = prompt[-PROMPT_TAIL:]
        seqs = [np.concatenate([tail, _sample(base, cfg.similarity, cfg.vocab, rng)]) for _ in range(cfg.responses)]
        t0, c0 = time.perf_counter(), time.thread_time()
        index.set_history(f"p{p}", seqs, [WEIGHT_ONE] * len(seqs))
        out.ingest_cpu_s += time.thread_time() - c0
        out.ingest_s += time.perf_counter() - t0
        out.history_tokens += sum(len(s) for s in seqs)
        out.prompts.append(prompt)
        out.truths.append(_sample(base, cfg.similarity, cfg.vocab, rng))
        if (p + 1) % max(1, cfg.prompts // 8) == 0:
            rate = out.history_tokens / max(out.ingest_s, 1e-9)
            say(f"{backend}: ingested {p + 1}/{cfg.prompts} prompts ({rate:,.0f} tok/s)")
    out.memory = index.memory_bytes() - base_memory
    return out


def _draft_step(index, batch_ids: list[str], budget: int, timed, threads: int, out: _Timings) -> list:
    """One ``draft_batch`` over the batch on ``threads`` threads, timed per request (``timed``: the native
    ``draft_batch_timed``; the reference drafts on one thread)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    if timed is not None:
        drafts, ns = timed(batch_ids, [budget] * len(batch_ids), threads=threads)
        out.per_request_us.extend(x / 1000.0 for x in ns)
    else:  # the reference: time each request's call
        drafts = []
        for rid in batch_ids:
            t1 = time.perf_counter()
            drafts.extend(index.draft_batch([rid], [budget]))
            out.per_request_us.append((time.perf_counter() - t1) * 1e6)
    wall = time.perf_counter() - t0
    out.cpu_s += time.thread_time() - c0
    out.step_ms.append(wall * 1e3)
    out.call_us.append(wall * 1e6 / len(batch_ids))
    out.request_steps += len(batch_ids)
    return drafts


def _decode(index, cfg: IndexBenchConfig, data: _Ingested, say: Callable[[str], None], backend: str) -> _Decoded:
    """One request per prompt decodes its ground truth: each step drafts the live batch, accepts the longest
    matching draft path and extends by it plus the bonus token."""
    ids = [f"r{p}" for p in range(cfg.prompts)]
    for p, rid in enumerate(ids):
        index.start(rid, f"p{p}", data.prompts[p].tolist())
    pos = [0] * cfg.prompts
    out = _Decoded()
    timed = getattr(getattr(index, "_impl", None), "draft_batch_timed", None)
    for step in range(cfg.steps):
        live = [p for p in range(cfg.prompts) if pos[p] < cfg.length]
        if not live:
            break
        threads, timings = (1, out.one) if step % 2 == 0 else (cfg.draft_threads, out.many)
        drafts = _draft_step(index, [ids[p] for p in live], cfg.budget, timed, threads, timings)
        for p, (toks, parents, _, _, _) in zip(live, drafts):
            truth = data.truths[p][pos[p] :]
            k = min(accepted_length(toks, parents, truth) + 1, len(truth))
            index.extend(ids[p], truth[:k].tolist())
            pos[p] += k
            out.emitted += k
            out.request_steps += 1
        if (step + 1) % max(1, cfg.steps // 4) == 0:
            say(f"{backend}: step {step + 1}/{cfg.steps}, p50 {np.percentile(out.one.per_request_us, 50):.2f} us")
    for rid in ids:
        index.remove_request(rid)
    return out


def _percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile of ``values``; None when there are none (a one-step run has no many-thread step)."""
    return float(np.percentile(values, q)) if values else None


def run_index_bench(
    cfg: IndexBenchConfig, backend: str = "native", progress: Callable[[str], None] | None = None
) -> dict:
    """Run the workload on one backend ("native" or "python"); returns the figures as a dict."""
    say = progress or (lambda msg: None)
    rng = np.random.default_rng(cfg.seed)
    index = _make_backend(cfg, backend)
    data = _ingest(index, cfg, rng, say, backend)
    dec = _decode(index, cfg, data, say, backend)
    us = np.asarray(dec.one.per_request_us)
    return {
        "backend": backend,
        "scorer": cfg.scorer,
        "ingest_tokens_per_s": data.history_tokens / data.ingest_cpu_s,
        "ingest_tokens_per_s_wall": data.history_tokens / data.ingest_s,
        "draft_us_p50": float(np.percentile(us, 50)),
        "draft_us_p99": float(np.percentile(us, 99)),
        "draft_us_mean": float(us.mean()),
        "call_us_per_request_p50": float(np.percentile(dec.one.call_us, 50)),
        "draft_cpu_us_per_request": dec.one.cpu_s * 1e6 / max(1, dec.one.request_steps),
        "step_ms_1thread": _percentile(dec.one.step_ms, 50),
        "step_ms_threads": _percentile(dec.many.step_ms, 50),
        "threads": cfg.draft_threads if backend == "native" else 1,
        "draft_us_p50_threads": _percentile(dec.many.per_request_us, 50),
        "draft_us_p99_threads": _percentile(dec.many.per_request_us, 99),
        "bytes_per_token": data.memory / data.history_tokens,
        "batch": cfg.prompts,
        "history_tokens_per_prompt": data.history_tokens // cfg.prompts,
        "history_tokens": data.history_tokens,
        "request_steps": dec.request_steps,
        "tau": tau(dec.emitted, dec.request_steps),
        "budget": cfg.budget,
        "similarity": cfg.similarity,
        "sources": ",".join(cfg.sources),
        "tree": cfg.tree,
        "load_avg_1min": os.getloadavg()[0],
    }
