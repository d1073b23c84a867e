"""Drafted path probability -> expected acceptance, learnt online from verify outcomes (``DraftCalibration``).

The drafter owns one (``HistoSpecDrafter.calibration``), so the engine's cost cut, replay and the SGLang plugin
share it. Rules (keys, bins, shrinkage, decay): docs/drafting.md section 10.1.

Example::

    cal = DraftCalibration(CalibrationConfig(prior_nodes=4.0, prior_scale=0.5))
    d = Draft([5, 6], [-1, 0], [1.0, 1.0], match_len=3, source="history")
    cal.calibrate_draft(d)                     # [0.5, 0.25]: no data yet, 0.5 per level
    cal.observe_draft(d, [True, False])        # the first node was accepted, its child not
    cal.calibrate_draft(d)                     # pulled towards the 50 % observed at conditional probability 1.0
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from sglang_histospec.drafting.flat import FlatDrafts
from sglang_histospec.drafting.types import Draft, accepted_path

BIN_EDGES = np.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.999])
"""Upper edges of the probability bins (the last bin holds probability 1.0 alone)."""
KEY_SOURCES = ("history", "siblings", "self", "global", "mixed", "anchors", "")
"""Draft sources (``Draft.source``) with a calibration of their own; anything else counts as ``""``."""
CALIBRATED_SOURCES = ("anchors",)
"""Sources whose probabilities are calibrated already (the anchor scorer's re-ranker learns its own from the outcome of
every trie node, drafted or not): their nodes pass through unchanged (observations are still counted, for
``table`` and ``by_source``). A second calibration on top learns from fewer nodes, lags a shift of the drafts'
mix (a step without history, then one with) and compounds along paths."""
MATCH_EDGES = (1, 2, 4, 8)
"""Match-length classes: 1, 2, 3-4, 5-8, longer."""
NUM_KEYS = len(KEY_SOURCES) * (len(MATCH_EDGES) + 1)
_CALIBRATED_KEY = np.repeat([s in CALIBRATED_SOURCES for s in KEY_SOURCES], len(MATCH_EDGES) + 1)  # [NUM_KEYS]


@dataclass(slots=True)
class CalibrationConfig:
    """Configuration of :class:`DraftCalibration`."""

    half_life_nodes: float = 2000.0
    """Observed draft nodes after which an observation weighs half (``math.inf``: never forget)."""
    prior_nodes: float = 4.0
    """Pseudo-count of each shrinkage level (a key's bin towards the pooled bin, that towards the prior)."""
    prior_scale: float = 0.25
    """With no data a node is expected to be accepted at this fraction of its drafted probability."""

    def __post_init__(self) -> None:
        if not self.half_life_nodes > 0.0:
            raise ValueError(f"CalibrationConfig.half_life_nodes={self.half_life_nodes!r}: expected a float > 0")
        if not self.prior_nodes > 0.0:
            raise ValueError(f"CalibrationConfig.prior_nodes={self.prior_nodes!r}: expected a float > 0")
        if not 0.0 < self.prior_scale <= 1.0:
            raise ValueError(f"CalibrationConfig.prior_scale={self.prior_scale!r}: expected a float in (0, 1]")


@functools.lru_cache(maxsize=4096)
def draft_key(source: str, match_len: int) -> int:
    """Index of a (source, match length) class in ``[0, NUM_KEYS)``. Example: ``draft_key("history", 1) == 0``."""
    s = KEY_SOURCES.index(source) if source in KEY_SOURCES else len(KEY_SOURCES) - 1
    return s * (len(MATCH_EDGES) + 1) + int(np.searchsorted(MATCH_EDGES, max(int(match_len), 1)))


def keys_of(flat: FlatDrafts) -> np.ndarray:  # [n] int64
    """The draft key (``draft_key``) of every node of ``flat``."""
    per_draft = np.fromiter((draft_key(d.source, d.match_len) for d in flat.drafts), np.int64, len(flat.drafts))
    return np.repeat(per_draft, flat.sizes)


class DraftCalibration:
    """Decayed acceptance counts per (draft key, probability bin); rules: docs/drafting.md section 10.1.

    The drafter's path probabilities are history frequencies; small samples make them overconfident (a context seen
    once drafts at probability 1.0), and how far depends on where a draft came from: a prompt's own history rhymes,
    a sibling in flight or the request's own text much less. So this learns the *conditional* acceptance of a node
    given that its parent was accepted, from the drafter's conditional probability (the node's path probability over
    its parent's), per draft key (source x match-length class) and probability bin (``BIN_EDGES``); a node's
    expected acceptance is the product along its path, so what the first levels of the trees teach carries to the
    deep ones. Three shrinkage levels: the key's bin, pulled towards the bin over all keys, pulled towards
    ``prior_scale`` x the conditional probability (an unmeasured drafter is trusted little).
    """

    def __init__(self, cfg: CalibrationConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else CalibrationConfig()
        shape = (NUM_KEYS, len(BIN_EDGES) + 1)
        self._nodes = np.zeros(shape)
        self._accepted = np.zeros(shape)
        self._prob_sum = np.zeros(shape)

    @staticmethod
    def bins(probs: np.ndarray) -> np.ndarray:  # [n] float -> [n] int64
        return np.searchsorted(BIN_EDGES, probs, side="left")

    def calibrate(
        self,
        cond: np.ndarray,  # [n] float conditional probabilities (node path probability / parent's)
        keys: np.ndarray,  # [n] int draft key of each node (draft_key)
    ) -> np.ndarray:  # [n] float expected conditional acceptance in [0, 1]
        """Expected acceptance of nodes given their parents were accepted (``cond`` itself for
        ``CALIBRATED_SOURCES``)."""
        b = self.bins(cond)
        w = self.cfg.prior_nodes
        n_all, acc_all, p_all = self._nodes.sum(0)[b], self._accepted.sum(0)[b], self._prob_sum.sum(0)[b]
        mean = np.where(n_all > 0, p_all / np.maximum(n_all, 1e-12), cond)  # the bin's drafted probability
        pooled = (acc_all + w * self.cfg.prior_scale * mean) / (n_all + w)
        q = (self._accepted[keys, b] + w * pooled) / (self._nodes[keys, b] + w)
        return np.where(_CALIBRATED_KEY[keys], cond, q)

    def observe(
        self,
        cond: np.ndarray,  # [n] float conditional probabilities of nodes whose parent was accepted
        keys: np.ndarray,  # [n] int their draft keys
        accepted: np.ndarray,  # [n] bool whether each node was accepted
    ) -> None:
        """Record verified draft nodes (each with an accepted parent) and their outcomes."""
        if not cond.shape == keys.shape == accepted.shape:
            raise ValueError(f"cond {cond.shape}, keys {keys.shape}, accepted {accepted.shape}: one each per node")
        if not len(cond):
            return
        keep = 0.5 ** (len(cond) / self.cfg.half_life_nodes) if math.isfinite(self.cfg.half_life_nodes) else 1.0
        self._nodes *= keep
        self._accepted *= keep
        self._prob_sum *= keep
        b = self.bins(cond)
        np.add.at(self._nodes, (keys, b), 1.0)
        np.add.at(self._prob_sum, (keys, b), cond)
        np.add.at(self._accepted, (keys[accepted], b[accepted]), 1.0)

    @staticmethod
    def flatten(
        drafts: list[Draft], limits: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [n] float cond, [n] int64 parents (flat, -1 = root), [n] keys
        """The first ``limits[i]`` nodes (default all; a BFS prefix) of every draft, concatenated: each node's
        conditional probability (its path probability over its parent's), its parent's flat index and its key."""
        flat = FlatDrafts.of(drafts, limits)
        return flat.cond(), flat.parents, keys_of(flat)

    def calibrate_flat(self, flat: FlatDrafts) -> np.ndarray:  # [n] float
        """Expected acceptance of every node of ``flat``: the product of calibrated conditionals along its path."""
        return flat.along_paths(self.calibrate(flat.cond(), keys_of(flat)), np.multiply)

    def calibrate_drafts(self, drafts: list[Draft], limits: list[int] | None = None) -> np.ndarray:  # [n] float
        """``calibrate_flat`` of the first ``limits[i]`` nodes of every draft (``flatten``'s order)."""
        return self.calibrate_flat(FlatDrafts.of(drafts, limits))

    def calibrate_draft(self, draft: Draft) -> np.ndarray:  # [len(draft)] float
        """``calibrate_drafts`` of one draft."""
        return self.calibrate_drafts([draft])

    def observe_drafts(self, drafts: list[Draft], accepted, verified=None) -> None:
        """Learn from verified drafts: ``accepted`` [n] bool marks the accepted nodes of ``flatten(drafts)``;
        ``verified`` (default: all) the nodes that were verified (an engine's cut may drop some). A node teaches
        only when it was verified and its parent is the root or accepted."""
        self.observe_flat(FlatDrafts.of(drafts), accepted, verified)

    def observe_flat(self, flat: FlatDrafts, accepted, verified=None) -> None:
        """``observe_drafts`` on the nodes of ``flat`` (``accepted``, ``verified``: [len(flat)] bool)."""
        cond = flat.cond()
        acc = np.asarray(accepted, dtype=bool)
        seen = np.ones(len(cond), dtype=bool) if verified is None else np.asarray(verified, dtype=bool).copy()
        if acc.shape != cond.shape or seen.shape != cond.shape:
            raise ValueError(f"accepted {acc.shape} / verified {seen.shape}: one flag per node of {cond.shape}")
        seen &= (flat.parents < 0) | acc[np.maximum(flat.parents, 0)]
        self.observe(cond[seen], keys_of(flat)[seen], acc[seen])

    def observe_draft(self, draft: Draft, accepted, verified=None) -> None:
        """``observe_drafts`` of one draft."""
        self.observe_drafts([draft], accepted, verified)

    def observe_tokens(self, draft: Draft, tokens: list[int]) -> np.ndarray:  # [len(draft)] bool
        """Learn from one draft verified against the ``tokens`` committed after it (accepted ones, then the
        bonus token); returns which nodes were accepted."""
        hit = np.zeros(len(draft), dtype=bool)
        hit[accepted_path(draft.token_ids, draft.parents, tokens)] = True
        self.observe_drafts([draft], hit)
        return hit

    def table(self) -> list[dict[str, float | str]]:
        """One row per conditional-probability bin with data, pooled over keys: upper edge, decayed nodes, mean
        drafted conditional probability and observed conditional acceptance."""
        n, acc, ps = self._nodes.sum(0), self._accepted.sum(0), self._prob_sum.sum(0)
        return [
            {
                "upper": float(BIN_EDGES[i]) if i < len(BIN_EDGES) else 1.0,
                "nodes": float(n[i]),
                "drafted": float(ps[i] / n[i]),
                "accepted": float(acc[i] / n[i]),
            }
            for i in range(len(n))
            if n[i] > 0
        ]

    def by_source(self) -> dict[str, dict[str, float]]:
        """Decayed nodes and observed acceptance per draft source with data."""
        per = len(MATCH_EDGES) + 1
        out = {}
        for s, name in enumerate(KEY_SOURCES):
            n = float(self._nodes[s * per : (s + 1) * per].sum())
            if n > 0:
                acc = float(self._accepted[s * per : (s + 1) * per].sum())
                out[name or "none"] = {"nodes": n, "accepted": acc / n}
        return out


__all__ = [
    "BIN_EDGES",
    "CALIBRATED_SOURCES",
    "KEY_SOURCES",
    "MATCH_EDGES",
    "NUM_KEYS",
    "CalibrationConfig",
    "DraftCalibration",
    "draft_key",
]
