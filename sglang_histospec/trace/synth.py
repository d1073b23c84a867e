"""Synthetic rollout traces with controllable drift between epochs and long-tailed lengths.

For tests, benchmarks and the HistoPipe simulator; figures quoted as results come from traces of real runs. The
generative model: :class:`SynthConfig`; docs/replay.md section 9.

Example::

    >>> cfg = SynthConfig(prompts=4, group_size=2, epochs=2, mean_len=32, vocab=100, seed=1)
    >>> recs = list(generate(cfg))
    >>> len(recs), recs[0].step, recs[-1].step
    (16, 0, 1)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sglang_histospec.trace.format import TraceRecord, TraceWriter


@dataclass(slots=True)
class SynthConfig:
    """Shape of a synthetic trace; every field is a CLI flag of ``histospec trace synth``.

    Model. Every prompt has a latent *base response* built from phrases (runs of ``phrase_len`` tokens) drawn from
    the prompt's own phrase pool, a pool shared by all prompts, or fresh random tokens, so responses repeat
    themselves (prompt lookup finds matches), share material across prompts (a global index helps) and resemble
    the prompt's earlier responses (history helps). Per epoch the base drifts: a share ``drift`` of its phrases is
    rewritten and its length is multiplied by ``exp(N(0, length_drift))``. Each sample of a group edits a share
    ``sample_noise`` of the base's phrases and scales its length by ``exp(N(0, sample_length_sigma))``; a share
    ``outlier_rate`` of the samples is further stretched by a factor in [outlier_min_scale, outlier_max_scale]
    (heavy-tailed stragglers, e.g. 3 % at 3-10x). Base lengths are log-normal (``mean_len``, ``length_sigma``; long
    right tail); every length is clipped to [min_len, max_len].
    """

    prompts: int = 64
    """Number of distinct prompts (each visited once per epoch)."""
    group_size: int = 8
    """Responses per prompt per visit (G)."""
    epochs: int = 3
    """Passes over the prompts."""
    steps_per_epoch: int = 1
    """Training steps per epoch; the (shuffled) prompts of an epoch are split evenly over them."""
    vocab: int = 32000
    """Token ids are drawn from [1, vocab); the EOS id is ``vocab - 1`` when ``eos`` is set."""
    prompt_len: int = 48
    """Prompt length in tokens."""
    mean_len: float = 256.0
    """Median base response length in tokens (log-normal)."""
    length_sigma: float = 0.8
    """Log-normal sigma of base lengths across prompts (0 = all equal; 1 = long tail)."""
    min_len: int = 4
    """Shortest response."""
    max_len: int = 4096
    """Longest response (lengths are clipped)."""
    drift: float = 0.1
    """Share of a prompt's base phrases rewritten between adjacent epochs (0 = no drift, 1 = all new)."""
    length_drift: float = 0.1
    """Log-normal sigma of a prompt's base length change between adjacent epochs."""
    sample_noise: float = 0.1
    """Share of the base phrases each sample rewrites (diversity within a group)."""
    sample_length_sigma: float = 0.15
    """Log-normal sigma of a sample's length around its prompt's base length."""
    outlier_rate: float = 0.0
    """Share of responses that run much longer than their siblings (a heavy per-sample tail; 0 = none)."""
    outlier_min_scale: float = 3.0
    """An outlier's length is its sample length times a factor drawn log-uniformly in [outlier_min_scale,
    outlier_max_scale] (before clipping to max_len)."""
    outlier_max_scale: float = 10.0
    """Upper end of the outlier factor (equal to outlier_min_scale: a fixed factor)."""
    phrase_len: int = 8
    """Mean phrase length in tokens."""
    self_repeat: float = 0.3
    """Probability that a phrase comes from the prompt's own phrase pool (self-repetition)."""
    shared: float = 0.1
    """Probability that a phrase comes from the pool shared by all prompts."""
    eos: bool = True
    """End each response with the EOS id ``vocab - 1``."""
    shuffle: bool = True
    """Shuffle the prompt order every epoch (otherwise steps always see the same prompts)."""
    seed: int = 0
    """Random seed; the same config and seed give the same trace."""

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "epochs", "steps_per_epoch", "prompt_len", "min_len", "phrase_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"SynthConfig.{name}={getattr(self, name)} must be >= 1")
        if self.vocab < 16:
            raise ValueError(f"SynthConfig.vocab={self.vocab} must be >= 16")
        if self.max_len < self.min_len:
            raise ValueError(f"SynthConfig.max_len={self.max_len} must be >= min_len={self.min_len}")
        if self.steps_per_epoch > self.prompts:
            raise ValueError(f"steps_per_epoch={self.steps_per_epoch} > prompts={self.prompts}: a step would be empty")
        for name in ("drift", "sample_noise", "self_repeat", "shared"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"SynthConfig.{name}={getattr(self, name)} must be in [0, 1]")
        if self.self_repeat + self.shared > 1.0:
            raise ValueError(f"self_repeat + shared = {self.self_repeat + self.shared} must be <= 1")
        if self.mean_len <= 0 or min(self.length_sigma, self.length_drift, self.sample_length_sigma) < 0:
            raise ValueError("mean_len must be > 0 and the sigmas >= 0")
        if not 0.0 <= self.outlier_rate <= 1.0:
            raise ValueError(f"SynthConfig.outlier_rate={self.outlier_rate} must be in [0, 1]")
        if not 1.0 <= self.outlier_min_scale <= self.outlier_max_scale:
            raise ValueError(
                f"SynthConfig.outlier_min_scale={self.outlier_min_scale}, outlier_max_scale={self.outlier_max_scale}:"
                " need 1 <= min <= max"
            )


class _Phrases:
    """Phrase source: the prompt's pool, the shared pool or fresh tokens."""

    def __init__(self, cfg: SynthConfig, rng: np.random.Generator, shared: list[np.ndarray]) -> None:
        self.cfg, self.rng, self.shared = cfg, rng, shared
        top = cfg.vocab - 1 if cfg.eos else cfg.vocab
        self.top = top
        self.own = [self.fresh() for _ in range(16)]

    def fresh(self) -> np.ndarray:
        n = int(self.rng.integers(max(1, self.cfg.phrase_len // 2), self.cfg.phrase_len * 3 // 2 + 1))
        return self.rng.integers(1, self.top, size=n, dtype=np.int64)

    def next(self) -> np.ndarray:
        u = self.rng.random()
        if u < self.cfg.self_repeat:
            return self.own[int(self.rng.integers(len(self.own)))]
        if u < self.cfg.self_repeat + self.cfg.shared:
            return self.shared[int(self.rng.integers(len(self.shared)))]
        return self.fresh()

    def fill(self, n: int) -> list[np.ndarray]:
        out, total = [], 0
        while total < n:
            p = self.next()
            out.append(p)
            total += len(p)
        return out


def _edit(phrases: list[np.ndarray], rate: float, src: _Phrases) -> list[np.ndarray]:
    """Rewrite each phrase with probability ``rate``."""
    if rate <= 0:
        return list(phrases)
    mask = src.rng.random(len(phrases)) < rate
    return [src.next() if m else p for p, m in zip(phrases, mask.tolist())]


def _resize(phrases: list[np.ndarray], n: int, src: _Phrases) -> np.ndarray:
    """Concatenate phrases, then truncate or extend with new phrases to exactly ``n`` tokens."""
    seq = np.concatenate(phrases) if phrases else np.zeros(0, dtype=np.int64)
    if len(seq) < n:
        seq = np.concatenate([seq, *src.fill(n - len(seq))])
    return seq[:n]


def _clip_len(cfg: SynthConfig, x: float) -> int:
    return int(min(cfg.max_len, max(cfg.min_len, round(x))))


def _outlier_factor(cfg: SynthConfig, rng: np.random.Generator) -> float:
    """1, or with probability ``outlier_rate`` a log-uniform factor in [outlier_min_scale, outlier_max_scale]."""
    if cfg.outlier_rate <= 0 or rng.random() >= cfg.outlier_rate:
        return 1.0
    lo, hi = np.log(cfg.outlier_min_scale), np.log(cfg.outlier_max_scale)
    return float(np.exp(rng.uniform(lo, hi)))


def generate(cfg: SynthConfig) -> Iterator[TraceRecord]:
    """Yield the records of a synthetic trace, sorted by step (then prompt order, then sample)."""
    rng = np.random.default_rng(cfg.seed)
    shared_src = _Phrases(cfg, rng, [np.zeros(1, dtype=np.int64)])
    shared = [shared_src.fresh() for _ in range(64)]
    top = cfg.vocab - 1 if cfg.eos else cfg.vocab
    names = [f"synth-{i:05d}" for i in range(cfg.prompts)]
    prompts = [rng.integers(1, top, size=cfg.prompt_len, dtype=np.int64).tolist() for _ in range(cfg.prompts)]
    srcs = [_Phrases(cfg, rng, shared) for _ in range(cfg.prompts)]
    log_len = rng.normal(np.log(cfg.mean_len), cfg.length_sigma, size=cfg.prompts)
    difficulty = rng.random(cfg.prompts)
    bases: list[list[np.ndarray]] = [[] for _ in range(cfg.prompts)]
    order = np.arange(cfg.prompts)
    for epoch in range(cfg.epochs):
        if epoch > 0:
            log_len = log_len + rng.normal(0.0, cfg.length_drift, size=cfg.prompts)
            bases = [_edit(b, cfg.drift, s) for b, s in zip(bases, srcs)]
        for i in range(cfg.prompts):  # the base covers the longest likely sample, so samples share their tails
            have = sum(len(p) for p in bases[i])
            need = _clip_len(cfg, np.exp(log_len[i] + 2 * cfg.sample_length_sigma))
            if have < need:
                bases[i] = bases[i] + srcs[i].fill(need - have)
        if cfg.shuffle:
            order = rng.permutation(cfg.prompts)
        for k, chunk in enumerate(np.array_split(order, cfg.steps_per_epoch)):
            step = epoch * cfg.steps_per_epoch + k
            for i in chunk.tolist():
                src = srcs[i]
                for j in range(cfg.group_size):
                    x = np.exp(log_len[i] + rng.normal(0.0, cfg.sample_length_sigma))
                    n = _clip_len(cfg, x * _outlier_factor(cfg, rng))
                    body = n - 1 if cfg.eos else n
                    resp = _resize(_edit(bases[i], cfg.sample_noise, src), body, src).tolist()
                    if cfg.eos:
                        resp.append(cfg.vocab - 1)
                    reward = float(rng.random() < difficulty[i])
                    yield TraceRecord(step, names[i], j, prompts[i], resp, epoch, reward)


def write_synthetic(path: str, cfg: SynthConfig) -> int:
    """Write ``generate(cfg)`` to ``path`` (``.gz``: gzip); returns the number of records."""
    with TraceWriter(path) as w:
        for rec in generate(cfg):
            w.write(rec)
    return w.count
