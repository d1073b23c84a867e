"""k-gram membership with 64-bit rolling hashes (numpy): the substring tests behind the oracle and trace stats.

``kgram_keys(seq, kmax)`` gives one key per (k, start) for k = 1..kmax; a k-gram of one sequence occurs in
another exactly when their keys are equal (up to 64-bit hash collisions, about n**2 / 2**65 for n keys: below
1e-3 for 1e8 keys). ``KeySet`` holds the keys of a set of source sequences; ``prefix_match`` turns membership
into "longest prefix of seq[p:] (at most kmax) that occurs in the sources", for every p at once.

Example::

    >>> s = KeySet(4); s.add([1, 2, 3, 4])
    >>> prefix_match([9, 2, 3, 7], 4, [s]).tolist()
    [0, 2, 1, 0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)
_LEN_SALT = np.arange(1, 1025, dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
PAD = np.uint64(0xFFFFFFFFFFFFFFFF)
"""Key of a (k, start) with start + k past the end of the sequence; never stored in a KeySet."""


def _mix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(31))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(29))


def kgram_keys(seq: Sequence[int] | np.ndarray, kmax: int) -> np.ndarray:
    """Keys of all k-grams of ``seq``; returns uint64 [kmax, len(seq)], row k-1 = k-grams, ``PAD`` past the end.

    Example: ``kgram_keys([5, 6, 5], 2)[0, 0] == kgram_keys([5], 1)[0, 0]`` (both are the 1-gram ``[5]``).
    """
    if kmax < 1 or kmax > len(_LEN_SALT):
        raise ValueError(f"kmax={kmax} must be in [1, {len(_LEN_SALT)}]")
    x = np.asarray(seq, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    n = len(x)
    out = np.full((kmax, n), PAD, dtype=np.uint64)
    h = x.copy()
    with np.errstate(over="ignore"):
        for k in range(1, kmax + 1):
            if k > n:
                break
            if k > 1:
                h = h[:-1] * _BASE + x[k - 1 :]
            key = _mix(h ^ _LEN_SALT[k - 1])
            key[key == PAD] = np.uint64(0)  # keep PAD unique
            out[k - 1, : n - k + 1] = key
    return out


class KeySet:
    """The k-gram keys (k <= kmax) of a growing set of sequences.

    Keys are kept in a few sorted levels whose sizes at least double (a log-structured merge): ``add`` buffers,
    a lookup first merges the buffer, so n adds cost O(n log n) in total and a lookup O(levels * log n).
    """

    def __init__(self, kmax: int) -> None:
        self.kmax = kmax
        self._levels: list[np.ndarray] = []
        self._pending: list[np.ndarray] = []

    def add(self, seq: Sequence[int] | np.ndarray) -> None:
        self.add_keys(kgram_keys(seq, self.kmax))

    def add_keys(self, keys: np.ndarray) -> None:
        """Add keys computed by ``kgram_keys`` with the same kmax (PAD entries are dropped)."""
        keys = keys.ravel()
        self._pending.append(keys[keys != PAD])

    def add_keys_from(self, other: KeySet) -> None:
        """Add every key of another set (same kmax)."""
        other._flush()
        self._pending.extend(other._levels)

    def _flush(self) -> None:
        if not self._pending:
            return
        new = sorted_unique(np.concatenate(self._pending))
        self._pending = []
        while self._levels and len(self._levels[-1]) <= 2 * len(new):
            new = sorted_unique(np.concatenate([self._levels.pop(), new]))
        self._levels.append(new)

    def __len__(self) -> int:
        self._flush()
        return int(sum(len(lv) for lv in self._levels))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Boolean array of ``keys``' shape: which keys are in the set (PAD never is)."""
        self._flush()
        out = np.zeros(keys.shape, dtype=bool)
        for lv in self._levels:
            idx = np.searchsorted(lv, keys)
            idx[idx == len(lv)] = 0
            out |= lv[idx] == keys
        return out

    @property
    def nbytes(self) -> int:
        return int(sum(lv.nbytes for lv in self._levels) + sum(p.nbytes for p in self._pending))


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique for uint64 keys by sorting (faster here than numpy's hash-based unique)."""
    x = np.sort(x)
    if len(x) > 1:
        x = x[np.concatenate(([True], x[1:] != x[:-1]))]
    return x


def _first_index(flat: np.ndarray) -> np.ndarray:
    """For each element, the index of the first element with the same value: int64 [n] -> int64 [n]."""
    order = np.argsort(flat, kind="stable")
    s = flat[order]
    new_group = np.empty(len(s), dtype=bool)
    new_group[:1] = True
    new_group[1:] = s[1:] != s[:-1]
    group = np.cumsum(new_group) - 1
    firsts = order[new_group]  # stable sort: the smallest index of each group comes first
    out = np.empty(len(flat), dtype=np.int64)
    out[order] = firsts[group]
    return out


def leading_true(mask: np.ndarray) -> np.ndarray:
    """Per column, the number of leading True values down the rows: bool [k, n] -> int64 [n]."""
    if mask.shape[0] == 0:
        return np.zeros(mask.shape[1], dtype=np.int64)
    first_false = np.argmin(mask, axis=0)
    return np.where(mask.all(axis=0), mask.shape[0], first_false).astype(np.int64)


def self_occurs(prefix: Sequence[int], seq: Sequence[int], kmax: int, keys: np.ndarray | None = None) -> np.ndarray:
    """bool [kmax, len(seq)]: does seq[p:p+k] occur inside ``prefix + seq[:p]`` (the context known at p)?

    ``keys`` may pass ``kgram_keys(prefix + seq, kmax)`` when the caller already has it.
    Example: for prefix [] and seq [1, 2, 1, 2], row 0 is [F, F, T, T] and row 1 is [F, F, T, F].
    """
    full = list(prefix) + list(seq)
    if keys is None:
        keys = kgram_keys(full, kmax)
    plen, n = len(prefix), len(seq)
    total = len(full)
    # One unique over all rows: keys of different k never coincide (length salt), so the first flat index of a
    # key is its first position in its own row.
    first = (_first_index(keys.ravel()) % max(total, 1)).reshape(keys.shape)[:, plen:]
    q = np.arange(plen, plen + n)[None, :]
    k = np.arange(1, kmax + 1)[:, None]
    return (first <= q - k) & (keys[:, plen:] != PAD)


def prefix_match(seq: Sequence[int] | np.ndarray, kmax: int, sets: Sequence[KeySet]) -> np.ndarray:
    """int64 [len(seq)]: longest prefix (<= kmax) of seq[p:] occurring in any of the key sets."""
    keys = kgram_keys(seq, kmax)
    mask = np.zeros(keys.shape, dtype=bool)
    for s in sets:
        mask |= s.contains(keys)
    return leading_true(mask)
