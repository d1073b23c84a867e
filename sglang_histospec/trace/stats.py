"""The paper's two observations on a trace, per pair of adjacent epochs (``histospec trace stats``).

Token reuse (the share of a response's tokens covered by m-token matches in the previous epoch's responses to the
same prompt) and length stability (rank correlations of per-prompt mean lengths): :func:`trace_stats`;
docs/replay.md section 8. Beside them, two properties of the responses themselves: their self-reuse (m-grams that
recur within a response: loops a drafter can copy from the response alone) and the share cut at the longest length.

Example::

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 40]), kendall([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from sglang_histospec.trace.format import TraceRecord
from sglang_histospec.trace.kgrams import PAD, kgram_keys, sorted_unique


def average_ranks(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """0-based ranks with ties averaged: [10, 30, 20, 20] -> [0, 3, 1.5, 1.5]."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    s = a[order]
    ranks = np.empty(len(a), dtype=np.float64)
    n = len(a)
    bounds = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [n]))
    for i, j in zip(starts.tolist(), ends.tolist()):
        ranks[order[i:j]] = (i + j - 1) / 2.0
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of average ranks (nan when either side is constant or n < 2)."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} vs {len(y)} values")
    if len(x) < 2:
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    den = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / den) if den > 0 else float("nan")


def kendall(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties corrected), Knight's O(n log n): sort by (x, y), count inversions of y (Fenwick)."""
    if len(x) != len(y):
        raise ValueError(f"kendall: {len(x)} vs {len(y)} values")
    n = len(x)
    if n < 2:
        return float("nan")
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    order = np.lexsort((b, a))
    a, b = a[order], b[order]

    def tied_pairs(*cols: np.ndarray) -> float:
        keys = np.stack(cols, axis=1)
        _, counts = np.unique(keys, axis=0, return_counts=True)
        return float((counts * (counts - 1) // 2).sum())

    n0 = n * (n - 1) / 2.0
    n1, n2, n3 = tied_pairs(a), tied_pairs(b), tied_pairs(a, b)
    ranks = np.searchsorted(np.unique(b), b) + 1  # 1-based dense ranks of y
    size = int(ranks.max())
    tree = [0] * (size + 1)
    inversions = 0
    for j, r in enumerate(ranks.tolist()):
        le, i = 0, r  # earlier elements with rank <= r
        while i > 0:
            le += tree[i]
            i -= i & -i
        inversions += j - le
        i = r
        while i <= size:
            tree[i] += 1
            i += i & -i
    s_val = n0 - n1 - n2 + n3 - 2.0 * inversions
    den = np.sqrt((n0 - n1) * (n0 - n2))
    return float(s_val / den) if den > 0 else float("nan")


def rank_moved_share(x: Sequence[float], y: Sequence[float], threshold: float = 0.1) -> float:
    """Share of items whose rank, as a fraction of n, differs by more than ``threshold`` between x and y."""
    n = len(x)
    if n == 0:
        return float("nan")
    return float((np.abs(average_ranks(x) - average_ranks(y)) / n > threshold).mean())


def coverage(response: Sequence[int], prev_keys: np.ndarray, m: int) -> int:
    """Tokens of ``response`` covered by m-grams that occur in ``prev_keys`` (sorted m-gram keys)."""
    n = len(response)
    if n < m or len(prev_keys) == 0:
        return 0
    keys = kgram_keys(response, m)[m - 1, : n - m + 1]
    idx = np.searchsorted(prev_keys, keys)
    idx[idx == len(prev_keys)] = 0
    hit = np.flatnonzero(prev_keys[idx] == keys)
    if len(hit) == 0:
        return 0
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, hit, 1)
    np.add.at(delta, hit + m, -1)
    return int((np.cumsum(delta[:n]) > 0).sum())


def self_coverage(response: Sequence[int], m: int) -> int:
    """Tokens of ``response`` covered by m-grams that already occurred earlier in it (loops, repeated lines).

    Example: m = 2, [1, 2, 3, 1, 2]: the 2-gram 12 recurs at position 3, covering its 2 tokens -> 2.
    """
    n = len(response)
    if n <= m:
        return 0
    keys = kgram_keys(response, m)[m - 1, : n - m + 1]
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    hit = np.flatnonzero(first[inverse] < np.arange(len(keys)))  # an earlier occurrence of the same m-gram
    if len(hit) == 0:
        return 0
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, hit, 1)
    np.add.at(delta, hit + m, -1)
    return int((np.cumsum(delta[:n]) > 0).sum())


@dataclass(slots=True)
class PairStats:
    """Statistics of one pair of adjacent epochs (``epochs = [e, e + 1]``)."""

    epochs: list[int]
    prompts: int
    responses: int
    token_reuse: float
    """Covered tokens / all tokens of epoch e + 1's responses (token-weighted)."""
    token_reuse_mean_response: float
    """Mean over responses of their covered share."""
    token_reuse_p10: float
    token_reuse_p50: float
    token_reuse_p90: float
    spearman: float
    kendall: float
    rank_moved_share: float
    reuse_shares: list[float] = field(default_factory=list, repr=False)
    """Per-response shares (for plots; not in the JSON)."""
    mean_lengths: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []), repr=False)
    """Per-prompt mean lengths in e and e + 1 (for plots; not in the JSON)."""


@dataclass(slots=True)
class TraceStats:
    """Result of ``trace_stats``; ``to_json()`` gives the documented JSON object."""

    epochs: int
    prompts: int
    responses: int
    tokens: int
    min_match: int
    length_p50: float
    length_p90: float
    length_p99: float
    length_max: int
    at_length_max_share: float
    """Share of responses exactly ``length_max`` long: those a recorder cut at its ``max_new_tokens``, usually."""
    self_reuse: float
    """Tokens covered by m-grams that occurred earlier in the same response / all tokens (token-weighted)."""
    epoch_source: str
    pairs: list[PairStats]
    lengths: list[int] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        def clean(v):
            return (
                None if isinstance(v, float) and not np.isfinite(v) else (round(v, 6) if isinstance(v, float) else v)
            )

        pairs = []
        for p in self.pairs:
            d = asdict(p)
            d.pop("reuse_shares")
            d.pop("mean_lengths")
            pairs.append({k: clean(v) for k, v in d.items()})
        out = {
            "epochs": self.epochs,
            "prompts": self.prompts,
            "responses": self.responses,
            "tokens": self.tokens,
            "min_match": self.min_match,
            "epoch_source": self.epoch_source,
            "length_p50": clean(self.length_p50),
            "length_p90": clean(self.length_p90),
            "length_p99": clean(self.length_p99),
            "length_max": self.length_max,
            "at_length_max_share": clean(self.at_length_max_share),
            "self_reuse": clean(self.self_reuse),
        }
        for key in ("token_reuse", "spearman", "kendall", "rank_moved_share"):  # means over pairs
            vals = [getattr(p, key) for p in self.pairs if np.isfinite(getattr(p, key))]
            out[key] = clean(float(np.mean(vals))) if vals else None
        out["pairs"] = pairs
        return out


def assign_epochs(records: list[TraceRecord]) -> tuple[list[int], str]:
    """Epoch of each record: the ``epoch`` field when all records have one, else the prompt's visit index."""
    if records and all(r.epoch is not None for r in records):
        return [int(r.epoch) for r in records], "field"
    steps_of: dict[str, list[int]] = {}
    for r in records:
        steps_of.setdefault(r.prompt_id, []).append(r.step)
    visit = {pid: {s: i for i, s in enumerate(sorted(set(v)))} for pid, v in steps_of.items()}
    return [visit[r.prompt_id][r.step] for r in records], "visit"


def _pair_stats(
    epoch: int, prev: dict[str, list[list[int]]], cur: dict[str, list[list[int]]], min_match: int
) -> PairStats:
    """Token reuse and length stability between epoch ``epoch`` (``prev``) and the next (``cur``)."""
    common = [pid for pid in cur if pid in prev]
    shares, covered, total = [], 0, 0
    len_a, len_b = [], []
    for pid in common:
        rows = [kgram_keys(r, min_match)[min_match - 1] for r in prev[pid] if len(r) >= min_match]
        keys = sorted_unique(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.uint64)
        keys = keys[keys != PAD]
        for resp in cur[pid]:
            if not resp:
                continue
            c = coverage(resp, keys, min_match)
            covered += c
            total += len(resp)
            shares.append(c / len(resp))
        len_a.append(float(np.mean([len(r) for r in prev[pid]])))
        len_b.append(float(np.mean([len(r) for r in cur[pid]])))
    sh = np.asarray(shares) if shares else np.asarray([np.nan])
    return PairStats(
        epochs=[epoch, epoch + 1],
        prompts=len(common),
        responses=len(shares),
        token_reuse=covered / total if total else float("nan"),
        token_reuse_mean_response=float(np.mean(sh)),
        token_reuse_p10=float(np.percentile(sh, 10)),
        token_reuse_p50=float(np.percentile(sh, 50)),
        token_reuse_p90=float(np.percentile(sh, 90)),
        spearman=spearman(len_a, len_b),
        kendall=kendall(len_a, len_b),
        rank_moved_share=rank_moved_share(len_a, len_b),
        reuse_shares=shares,
        mean_lengths=(len_a, len_b),
    )


def trace_stats(records: Iterable[TraceRecord], min_match: int = 4) -> TraceStats:
    """Compute both observations for every pair of adjacent epochs (docs/replay.md section 8).

    1. Token reuse: the share of a response's tokens covered by matches of at least ``m`` tokens in the previous
       epoch's responses to the same prompt (a token is covered when some substring of length >= m around it occurs
       there; equivalently, when one of the m-grams containing it occurs there).
    2. Length stability: rank correlation (Spearman, Kendall tau-b; ties get average ranks) of per-prompt mean
       response length between the two epochs, and the share of prompts whose length rank (as a fraction of the
       number of prompts) moves by more than a decile (0.1).

    Epochs: a record's ``epoch`` field when every record has one; otherwise the prompt's visit index (0 for the
    first step in which the prompt appears, 1 for the next, ...). Only prompts present in both epochs of a pair
    count for that pair.
    """
    if min_match < 1:
        raise ValueError(f"min_match={min_match} must be >= 1")
    recs = list(records)
    if not recs:
        raise ValueError("trace_stats: no records")
    epochs, source = assign_epochs(recs)
    by: dict[int, dict[str, list[list[int]]]] = {}
    for r, e in zip(recs, epochs):
        by.setdefault(e, {}).setdefault(r.prompt_id, []).append(r.response)
    pairs = [_pair_stats(e, by[e], by[e + 1], min_match) for e in sorted(by) if e + 1 in by]
    lengths = [len(r.response) for r in recs]
    la = np.asarray(lengths, dtype=np.float64)
    self_covered = sum(self_coverage(r.response, min_match) for r in recs)
    return TraceStats(
        epochs=len(by),
        prompts=len({r.prompt_id for r in recs}),
        responses=len(recs),
        tokens=int(la.sum()),
        min_match=min_match,
        length_p50=float(np.percentile(la, 50)),
        length_p90=float(np.percentile(la, 90)),
        length_p99=float(np.percentile(la, 99)),
        length_max=int(la.max()),
        at_length_max_share=float((la == la.max()).mean()),
        self_reuse=self_covered / max(1.0, float(la.sum())),
        epoch_source=source,
        pairs=pairs,
        lengths=lengths,
    )
