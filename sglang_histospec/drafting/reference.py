"""Pure-Python reference backend of the history index: simple, obviously correct, slow.

It implements the backend interface and the exact semantics of docs/drafting.md (sections 3-6 and 9); the native
index must return the same drafts bit for bit. Validation, steps, weights, LRU and snapshots are the facade's.

Example (one history response ``[7, 1, 2, 3]`` whose first token ``7`` is the prompt tail)::

    idx = ReferenceIndex(min_match=1, max_match=8, tree=True, min_prob=0.1, use_frequency=True,
                         sources=("history",))
    idx.set_history("p", [np.array([7, 1, 2, 3], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [5, 7])
    idx.draft_batch(["r"], [2])  # -> [([1, 2], [-1, 0], [1.0, 1.0], 1, "history")]
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass, field
from typing import Any

from sglang_histospec.drafting.types import COUNTS_SOURCES, MAX_BUDGET, MAX_TOKEN_ID, ROOT, SOURCES, WEIGHT_ONE

__all__ = ["MAX_BUDGET", "SOURCES", "WEIGHT_ONE", "DraftTuple", "ReferenceIndex", "SourceStore", "merge_drafts"]

DraftTuple = tuple[list[int], list[int], list[float], int, str]
"""(token_ids, parents, probs, match_len, source) as returned by ``draft_batch``."""


@dataclass(frozen=True)
class _Corpus:
    """Immutable weighted sequences plus an index token -> positions; swapped in whole, never mutated."""

    seqs: tuple[tuple[int, ...], ...]
    weights: tuple[int, ...]
    by_token: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # token -> [(seq index, position)]

    @classmethod
    def build(cls, seqs, weights) -> _Corpus:
        tseqs = tuple(tuple(int(t) for t in s) for s in seqs)
        by_token: dict[int, list[tuple[int, int]]] = {}
        for si, s in enumerate(tseqs):
            for k, t in enumerate(s):
                by_token.setdefault(t, []).append((si, k))
        return cls(tseqs, tuple(int(w) for w in weights), by_token)

    def num_tokens(self) -> int:
        return sum(len(s) for s in self.seqs)


@dataclass
class _Request:
    prompt_id: str | None
    context: list[int]  # [n] prompt tokens + generated tokens


# An occurrence: (sequence, index of the token after the matched string, weight).
_Occ = tuple[tuple[int, ...], int, int]


class SourceStore:
    """The sources of a Python backend: each prompt's history, the open step's siblings and the global groups, each
    an immutable ``corpus_type.build(sequences, weights)`` built outside the lock, then swapped in."""

    corpus_type: type = _Corpus

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._history: dict[str, Any] = {}
        self._siblings: dict[str, tuple[Any, ...]] = {}
        self._global: dict[int, Any] = {}

    def set_history(self, prompt_id: str, sequences, weights: list[int]) -> None:
        corpus = self.corpus_type.build(sequences, weights)
        with self._lock:
            if corpus.seqs:
                self._history[prompt_id] = corpus
            else:
                self._history.pop(prompt_id, None)

    def add_sibling(self, prompt_id: str, sequence, weight: int) -> None:
        corpus = self.corpus_type.build([sequence], [weight])
        with self._lock:
            self._siblings[prompt_id] = self._siblings.get(prompt_id, ()) + (corpus,)

    def clear_siblings(self) -> None:
        with self._lock:
            self._siblings = {}

    def add_global(self, key: int, sequences, weights: list[int]) -> None:
        corpus = self.corpus_type.build(sequences, weights)
        with self._lock:
            self._global[key] = corpus

    def remove_global(self, key: int) -> None:
        with self._lock:
            self._global.pop(key, None)


class ReferenceIndex(SourceStore):
    """Reference backend; same interface as ``NativeIndex`` (``docs/drafting.md`` section 9)."""

    def __init__(
        self,
        *,
        min_match: int,
        max_match: int,
        tree: bool,
        min_prob: float,
        use_frequency: bool,
        sources: tuple[str, ...],
    ) -> None:
        self.min_match = min_match
        self.max_match = max_match
        self.tree = tree
        self.min_prob = min_prob
        self.use_frequency = use_frequency
        unknown = [s for s in sources if s not in COUNTS_SOURCES]
        if unknown:
            raise ValueError(f"source {unknown[0]!r}: the counts scorer drafts from a subset of {COUNTS_SOURCES}")
        self.sources = tuple(s for s in SOURCES if s in sources)
        super().__init__()
        self._requests: dict[str, _Request] = {}

    # ---- requests ------------------------------------------------------------------------------------------
    def start(self, req_id: str, prompt_id: str | None, prompt_tokens: list[int]) -> None:
        with self._lock:
            self._requests[req_id] = _Request(prompt_id, [int(t) for t in prompt_tokens])

    def extend(self, req_id: str, tokens: list[int]) -> None:
        self._requests[req_id].context.extend(int(t) for t in tokens)

    def remove_request(self, req_id: str) -> None:
        with self._lock:
            self._requests.pop(req_id, None)

    def has_request(self, req_id: str) -> bool:
        return req_id in self._requests

    def draft_batch(self, req_ids: list[str], budgets: list[int]) -> list[DraftTuple]:
        return [self._draft(r, b) for r, b in zip(req_ids, budgets)]

    # ---- drafting (docs/drafting.md sections 3-6) ------------------------------------------------------------
    def _draft(self, req_id: str, budget: int) -> DraftTuple:
        req = self._requests[req_id]
        empty: DraftTuple = ([], [], [], 0, "")
        if budget <= 0:
            return empty
        with self._lock:  # grab references to the current immutable corpora
            per_source: dict[str, tuple[_Corpus, ...]] = {
                "history": (self._history[req.prompt_id],) if req.prompt_id in self._history else (),
                "siblings": self._siblings.get(req.prompt_id, ()) if req.prompt_id is not None else (),
                "global": tuple(self._global.values()),
            }
            context = tuple(req.context)
        cands: list[DraftTuple] = []
        for name in self.sources:
            if name == "self":
                cand = self._draft_source(context, None, budget)
            else:
                if not per_source[name]:
                    continue
                cand = self._draft_source(context, per_source[name], budget)
            if cand[0]:
                cands.append((cand[0], cand[1], cand[2], cand[3], name))
        if not cands:
            return empty
        if len(cands) == 1:
            return cands[0]
        return merge_drafts(cands, budget)

    def _draft_source(self, context: tuple[int, ...], corpora, budget: int) -> DraftTuple:
        n = len(context)
        if corpora is None:  # the request's own context; the occurrence at its very end is excluded
            corpora = (_Corpus.build([context], [WEIGHT_ONE]),)
            exclude_end = True
        else:
            exclude_end = False
        for length in range(min(self.max_match, n), self.min_match - 1, -1):
            pattern = context[n - length :]
            occ = self._occurrences(corpora, pattern)
            if exclude_end:
                occ = [o for o in occ if o[1] != n]
            if not occ:
                continue
            tokens, parents, probs = self._expand(occ, budget)
            if tokens:
                return tokens, parents, probs, length, ""
        return [], [], [], 0, ""

    @staticmethod
    def _occurrences(corpora, pattern: tuple[int, ...]) -> list[_Occ]:
        length = len(pattern)
        out: list[_Occ] = []
        for corpus in corpora:
            for si, k in corpus.by_token.get(pattern[-1], ()):
                start = k - length + 1
                seq = corpus.seqs[si]
                if start >= 0 and seq[start : k + 1] == pattern:
                    out.append((seq, k + 1, corpus.weights[si]))
        return out

    def _count(self, occ: list[_Occ]) -> int:
        if self.use_frequency:
            return sum(w for _, _, w in occ)
        return max(w for _, _, w in occ)

    def _children(self, occ: list[_Occ]) -> list[tuple[int, list[_Occ]]]:
        """Children in ascending token id, each with its occurrences advanced by one token."""
        groups: dict[int, list[_Occ]] = {}
        for seq, j, w in occ:
            if j < len(seq):
                groups.setdefault(seq[j], []).append((seq, j + 1, w))
        return sorted(groups.items())

    def _expand(self, root_occ: list[_Occ], budget: int) -> tuple[list[int], list[int], list[float]]:
        # node record: [token, parent node index or ROOT, p, depth, occurrences]
        nodes: list[tuple[int, int, float, int, list[_Occ]]] = []
        heap: list[tuple[float, int, int]] = []  # (-p, seq counter, node index)
        counter = 0

        def push_children(parent: int, parent_p: float, parent_depth: int, occ: list[_Occ]) -> None:
            nonlocal counter
            parent_w = float(self._count(occ))
            for token, child_occ in self._children(occ):
                q = float(self._count(child_occ)) / parent_w
                p = parent_p * q
                nodes.append((token, parent, p, parent_depth + 1, child_occ))
                heapq.heappush(heap, (-p, counter, len(nodes) - 1))
                counter += 1

        push_children(ROOT, 1.0, 0, root_occ)
        selected: list[int] = []  # node indices in pop order
        pop_rank: dict[int, int] = {}
        while heap and len(selected) < budget:
            neg_p, _, node = heapq.heappop(heap)
            if -neg_p < self.min_prob:
                break
            pop_rank[node] = len(selected)
            selected.append(node)
            if not self.tree:
                heap.clear()
            token, _, p, depth, occ = nodes[node]
            push_children(node, p, depth, occ)
        # BFS output: by depth, then parent's output index, then pop rank
        out_index: dict[int, int] = {}
        order: list[int] = []
        by_depth: dict[int, list[int]] = {}
        for node in selected:
            by_depth.setdefault(nodes[node][3], []).append(node)
        for depth in sorted(by_depth):
            level = sorted(
                by_depth[depth],
                key=lambda v: (out_index[nodes[v][1]] if nodes[v][1] != ROOT else ROOT, pop_rank[v]),
            )
            for v in level:
                out_index[v] = len(order)
                order.append(v)
        tokens = [nodes[v][0] for v in order]
        parents = [out_index[nodes[v][1]] if nodes[v][1] != ROOT else ROOT for v in order]
        probs = [nodes[v][2] for v in order]
        return tokens, parents, probs

    # ---- accounting and checks ------------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Rough size of the stored structures: 4 bytes per token plus 16 per index entry (Python overhead not counted)."""
        with self._lock:
            corpora = list(self._history.values()) + list(self._global.values())
            corpora += [c for group in self._siblings.values() for c in group]
            ctx = sum(len(r.context) for r in self._requests.values())
        return sum(20 * c.num_tokens() + 8 * len(c.seqs) for c in corpora) + 4 * ctx

    def check_integrity(self) -> str | None:
        with self._lock:
            named = [(f"history[{k}]", c) for k, c in self._history.items()]
            named += [(f"global[{k}]", c) for k, c in self._global.items()]
            named += [(f"siblings[{k}]", c) for k, g in self._siblings.items() for c in g]
            requests = dict(self._requests)
        for name, c in named:
            if len(c.seqs) != len(c.weights):
                return f"{name}: {len(c.seqs)} sequences but {len(c.weights)} weights"
            if any(w < 1 for w in c.weights):
                return f"{name}: weight < 1"
            if sum(len(v) for v in c.by_token.values()) != c.num_tokens():
                return f"{name}: index holds a different number of positions than tokens"
            for t, positions in c.by_token.items():
                if any(c.seqs[si][k] != t for si, k in positions):
                    return f"{name}: index entry for token {t} points at another token"
        for rid, r in requests.items():
            if any(not (0 <= t < MAX_TOKEN_ID) for t in r.context):
                return f"request {rid}: token out of range"
        return None


def merge_drafts(cands: list[DraftTuple], budget: int) -> DraftTuple:
    """Union of several sources' drafts (``docs/drafting.md`` section 6): one tree, summed path probabilities.

    Example: ``([5], [-1], [1.0], 2, "history")`` and ``([5, 6], [-1, -1], [0.5, 0.5], 1, "self")`` at budget 2
    give ``([5, 6], [-1, -1], [0.75, 0.25], 2, "mixed")``.
    """
    k = len(cands)
    # union trie keyed by token path; each node: [token, parent node or ROOT, summed p, depth, children dict]
    nodes: list[list] = []
    roots: dict[int, int] = {}
    for tokens, parents, probs, _, _ in cands:
        ids: list[int] = []
        for t, par, pr in zip(tokens, parents, probs):
            kids = roots if par == ROOT else nodes[ids[par]][4]
            v = kids.get(t)
            if v is None:
                v = len(nodes)
                nodes.append(
                    [t, ROOT if par == ROOT else ids[par], 0.0, 0 if par == ROOT else nodes[ids[par]][3] + 1, {}]
                )
                kids[t] = v
            nodes[v][2] += pr
            ids.append(v)
    kf = float(k)
    heap: list[tuple[float, int, int]] = []
    counter = 0

    def push(kids: dict[int, int]) -> None:
        nonlocal counter
        for t in sorted(kids):
            v = kids[t]
            heapq.heappush(heap, (-(nodes[v][2] / kf), counter, v))
            counter += 1

    push(roots)
    selected: list[int] = []
    pop_rank: dict[int, int] = {}
    while heap and len(selected) < budget:
        _, _, v = heapq.heappop(heap)
        pop_rank[v] = len(selected)
        selected.append(v)
        push(nodes[v][4])
    out_index: dict[int, int] = {}
    order: list[int] = []
    by_depth: dict[int, list[int]] = {}
    for v in selected:
        by_depth.setdefault(nodes[v][3], []).append(v)
    for depth in sorted(by_depth):
        level = sorted(by_depth[depth], key=lambda v: (out_index.get(nodes[v][1], ROOT), pop_rank[v]))
        for v in level:
            out_index[v] = len(order)
            order.append(v)
    tokens = [nodes[v][0] for v in order]
    parents = [out_index[nodes[v][1]] if nodes[v][1] != ROOT else ROOT for v in order]
    probs = [nodes[v][2] / kf for v in order]
    return tokens, parents, probs, max(c[3] for c in cands), "mixed"
