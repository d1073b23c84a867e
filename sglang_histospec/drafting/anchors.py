"""The anchor scorer (``DrafterConfig.scorer="anchors"``): calibrated anchors over every match, not the longest one.

Sources: the prompt's history, its finished siblings, the request's own context, the global FIFO, and its running
siblings (the other started requests of the same prompt: prompt tail + the tokens emitted so far).

An *anchor* is a place in a source whose preceding tokens match the request's context, exactly (any length) or up
to one substituted last token; where the aligned tokens before it differ from the context, a *rewritten* copy of
its continuation carries the context's tokens over (a value the response computed differently, copied again later)
as an anchor of its own kinds. Each anchor has a class (source, kind, match length, aligned agreement, age, offset,
recency) whose per-depth hit rates are learnt online from the tokens that follow; a trie node scores the noisy-OR
of its anchors' rates, re-ranked by a logistic model over the node's features (its depth, score, best rate, how many
anchors and of which kinds pass through it), learnt online; the draft is the best ``budget`` nodes. Semantics:
docs/drafting.md section 13; same backend interface as ``ReferenceIndex``.

Example::

    idx = AnchorIndex(min_match=1, max_match=32, prompt_tail=1, sources=("history",))
    idx.set_history("p", [np.array([7, 1, 2, 3], dtype=np.int32)], [WEIGHT_ONE])
    idx.start("r", "p", [5, 7]); idx.draft_batch(["r"], [2])[0][0]   # [1, 2]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sglang_histospec.drafting.reference import SourceStore
from sglang_histospec.drafting.types import SOURCES

DEPTH_MAX = 32
"""Deepest node an anchor drafts, and how many tokens after a draft its outcome is read from."""
SCAN = 256
"""Most recent candidate positions examined per source and kind."""
MAX_ANCHORS = 48
"""Anchors per draft (the best by learnt first-token rate)."""
HAM_WINDOW = 16
"""Aligned tokens before an anchor compared with the context (agreement beyond the exact match)."""
SUB_MIN_MATCH = 2
"""Shortest match before a substituted token."""
GLOBAL_MIN_MATCH = 3
"""Shortest exact match in the global source (one- and two-token matches there are noise)."""
LENGTH_EDGES = (2, 3, 4, 6, 9, 13, 21)
"""Match-length (and node-depth) classes: 1, 2, 3, 4-5, 6-8, 9-12, 13-20, 21+."""
SCORE_EDGES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99)
"""Classes of a node's raw score and of its best anchor's rate in the re-ranker (a value falls in the class that
counts the edges below it)."""
RATE_PRIOR, RATE_PRIOR_NODES = 0.6, 4
"""Prior hit rate at depth d: RATE_PRIOR ** (d + 1), weighing RATE_PRIOR_NODES observations."""
COUNT_EDGES = (2, 3, 5, 9, 17)
"""Classes of the number of anchors through a node: 1, 2, 3-4, 5-8, 9-16, 17+."""
FEATURE_SIZES = (len(LENGTH_EDGES) + 1, len(SCORE_EDGES) + 1, len(SCORE_EDGES) + 1, len(COUNT_EDGES) + 1, 6,
                 len(LENGTH_EDGES) + 1, 4, 3, 3, 3, 3, 3)  # fmt: skip
"""The re-ranker's features of a node, each a class with a learnt weight: depth, raw score, best rate, anchors
through it, their share of its parent's, their longest match, their best agreement, and the thirds of them that are
substitutions, rewritten copies, history, self and running anchors (``node_features``)."""
NUM_WEIGHTS = sum(FEATURE_SIZES) + 2
"""The re-ranker's weights: one per feature class, then the bias and the slope of the raw score's logit."""
RERANK_LR, LOGIT_CLIP, LOGIT_MAX = 0.002, 1e-4, 30.0
"""The re-ranker's learning rate, the clip of the raw score before its logit, and the bound of a node's logit."""
NUM_EXTRA = 12
NUM_KINDS = 4
"""Anchor kinds: 0 exact, 1 substitution, 2 and 3 their rewritten copies (``REWRITTEN`` + kind)."""
REWRITTEN = 2
NUM_CLASSES = len(SOURCES) * NUM_KINDS * (len(LENGTH_EDGES) + 1) * 4 * NUM_EXTRA
_OFFSETS = tuple(sum(FEATURE_SIZES[:k]) for k in range(len(FEATURE_SIZES)))

_PRIOR = np.cumprod(np.full(DEPTH_MAX, RATE_PRIOR))  # [DEPTH_MAX] RATE_PRIOR ** (d + 1), by repeated products
COPY_PRIOR = 0.5
"""A rewritten copy's prior hit rates are this times an original's: a copy is a guess on top of a match, and must
earn its trust (an exact repeat of a history response drafts as it did without copies until the copies learn)."""


def length_class(n: int) -> int:
    """Class of a match length or node depth. Example: ``length_class(1) == 0``, ``length_class(5) == 3``."""
    return sum(1 for e in LENGTH_EDGES if n >= e)


def _score_bin(x: float) -> int:
    return sum(1 for e in SCORE_EDGES if e < x)


def share_class(count: int, parent_count: int) -> int:
    """Class of a node that ``count`` of its parent's ``parent_count`` anchors pass through: ``5 * count //
    parent_count``, and 5 when all of them do. Example: ``share_class(1, 4) == 1``, ``share_class(3, 3) == 5``."""
    return 5 if count == parent_count else 5 * count // parent_count


def _count_class(n: int) -> int:
    return sum(1 for e in COUNT_EDGES if n >= e)


def _third(part: int, whole: int) -> int:
    return min(2, 3 * part // whole)


def node_features(depth: int, raw: float, best: float, count: int, parent_count: int, tally: list[int]) -> tuple:
    """The re-ranker's feature classes of a trie node (``FEATURE_SIZES``). ``tally``: over the anchors through it,
    their longest match's length class, their best agreement class, and how many are substitutions (kind 1),
    rewritten copies (kinds 2-3), history, self and running anchors. Example: a depth-1 node that all 3 anchors
    share, each an exact history match of length 4 with agreement class 0, ``node_features(1, 0.9, 0.6, 3, 3,
    [3, 0, 0, 0, 3, 0, 0])`` is ``(0, 10, 6, 2, 5, 3, 0, 0, 0, 2, 0, 0)``."""
    lc, ham, sub, copy, hist, own, run = tally
    return (length_class(depth), _score_bin(raw), _score_bin(best), _count_class(count),
            share_class(count, parent_count), lc, ham, _third(sub, count), _third(copy, count),
            _third(hist, count), _third(own, count), _third(run, count))  # fmt: skip


def raw_logit(raw: float) -> float:
    """The logit of the raw score, clipped to [LOGIT_CLIP, 1 - LOGIT_CLIP]."""
    x = min(max(raw, LOGIT_CLIP), 1.0 - LOGIT_CLIP)
    return math.log(x / (1.0 - x))


def _ham_class(extra: int) -> int:
    return 0 if extra <= 0 else 1 if extra <= 3 else 2 if extra <= 7 else 3


def _offset_class(dist: int) -> int:
    return 0 if dist <= 2 else 1 if dist <= 10 else 2 if dist <= 40 else 3


def anchor_class(source: int, kind: int, length: int, ham: int, extra: int) -> int:
    """Index in ``[0, NUM_CLASSES)``: source index, kind (0 exact, 1 substitution, 2-3 rewritten), length class,
    agreement class and the source's extra feature (``docs/drafting.md`` section 13.2)."""
    return (
        ((source * NUM_KINDS + kind) * (len(LENGTH_EDGES) + 1) + length_class(length)) * 4 + ham
    ) * NUM_EXTRA + extra


@dataclass(frozen=True)
class _Corpus:
    """Immutable sequences (oldest first) with weight classes and postings token -> [(seq, j)], oldest first,
    where ``seqs[seq][j - 1] == token`` and ``j < len(seqs[seq])``."""

    seqs: tuple[tuple[int, ...], ...]
    wclass: tuple[int, ...]
    postings: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def build(cls, seqs, weights) -> _Corpus:
        tseqs = tuple(tuple(int(t) for t in s) for s in seqs)
        wmax = max((int(w) for w in weights), default=1)
        wclass = tuple(0 if 2 * int(w) > wmax else 1 if 4 * int(w) > wmax else 2 for w in weights)
        postings: dict[int, list[tuple[int, int]]] = {}
        for si, s in enumerate(tseqs):
            for j in range(1, len(s)):
                postings.setdefault(s[j - 1], []).append((si, j))
        return cls(tseqs, wclass, postings)

    def num_tokens(self) -> int:
        return sum(len(s) for s in self.seqs)


@dataclass
class _Pending:
    """A draft whose outcome is read once ``DEPTH_MAX`` more tokens are known (or the request ends)."""

    pos: int  # context length when drafted
    reach: int  # deepest depth the draft's budget let it reach: min(budget, DEPTH_MAX)
    anchors: list[tuple[int, tuple[int, ...]]]  # (class, continuation)
    kids: list[dict[int, int]]  # trie: node -> {token: child}; node 0 is the root
    depth: list[int]
    features: list[tuple[int, ...]]  # [nodes] the re-ranker's feature classes (root: empty)
    raws: list[float]  # [nodes] each node's raw (noisy-OR) score (root: 1.0)


@dataclass
class _Request:
    prompt_id: str | None
    context: list[int]
    prompt_len: int
    pending: list[_Pending] = field(default_factory=list)


def _match(seq, j: int, ctx, n: int, limit: int) -> int:
    """Largest l <= limit with seq[j-l:j] == ctx[n-l:n]."""
    lim = min(limit, j, n)
    length = 0
    while length < lim and seq[j - 1 - length] == ctx[n - 1 - length]:
        length += 1
    return length


def _agree(seq, j: int, ctx, n: int, start: int) -> int:
    """Aligned equal tokens seq[j-1-k] == ctx[n-1-k] for k in [start, HAM_WINDOW)."""
    stop = min(HAM_WINDOW, j, n)
    return sum(1 for k in range(start, stop) if seq[j - 1 - k] == ctx[n - 1 - k])


def rewritten(seq, j: int, ctx, n: int, reach: int) -> tuple[int, ...] | None:
    """``seq[j : j + reach]`` with the context's tokens carried over, or None when nothing changes (section 13.1).

    Each aligned mismatch ``seq[j-1-k] != ctx[n-1-k]`` (k < ``HAM_WINDOW``, nearest first) is a rule: after
    ``seq[j-2-k]``, ``seq[j-1-k]`` reads ``ctx[n-1-k]``; a continuation token is replaced where its own bigram in
    ``seq`` has a rule. Example: history ``= 1 6 2 . 1 6 2`` against a context ending ``= 1 6 0`` (rule (6, 2) -> 0)
    drafts ``. 1 6 0``.
    """
    rules: dict[tuple[int, int], int] = {}
    for k in range(min(HAM_WINDOW, j - 1, n)):
        h, c = seq[j - 1 - k], ctx[n - 1 - k]
        if h != c:
            rules.setdefault((seq[j - 2 - k], h), c)
    if not rules:
        return None
    cont, changed = list(seq[j : j + reach]), False
    for i in range(len(cont)):
        r = rules.get((seq[j + i - 1], cont[i]))
        if r is not None:
            cont[i], changed = r, True
    return tuple(cont) if changed else None


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class _Trie:
    """A draft's trie under construction: node 0 is the root; per node its token, parent, depth, the noisy-OR
    miss and best rate of its anchors, how many pass through it and their tally (``node_features``)."""

    def __init__(self, num_anchors: int) -> None:
        self.kids: list[dict[int, int]] = [{}]
        self.tok, self.par, self.depth = [0], [-1], [0]
        self.miss, self.best, self.count = [1.0], [0.0], [num_anchors]
        self.tally: list[list[int]] = [[0] * 7]
        self.anchors: list[tuple[int, tuple[int, ...]]] = []
        self.features: list[tuple[int, ...]] = [()]
        self.raws: list[float] = [1.0]

    def raw(self, v: int) -> float:
        """The noisy-OR of the rates of the anchors through ``v``."""
        return 1.0 - self.miss[v]

    def child(self, v: int, token: int) -> int:
        """The child of ``v`` for ``token``, created when missing."""
        nv = self.kids[v].get(token)
        if nv is None:
            nv = self.kids[v][token] = len(self.tok)
            self.kids.append({})
            self.tok.append(token)
            self.par.append(v)
            self.depth.append(self.depth[v] + 1)
            self.miss.append(1.0)
            self.best.append(0.0)
            self.count.append(0)
            self.tally.append([0] * 7)
        return nv

    def add(self, v: int, rate: float, lc: int, ham: int, kind: int, source: int) -> None:
        """An anchor passes ``v``: its rate at this depth, match length class, agreement class, kind and source."""
        self.miss[v] *= 1.0 - rate
        self.best[v] = max(self.best[v], rate)
        self.count[v] += 1
        t = self.tally[v]
        t[0], t[1] = max(t[0], lc), max(t[1], ham)
        t[2] += kind == 1
        t[3] += kind >= REWRITTEN
        t[4] += SOURCES[source] == "history"
        t[5] += SOURCES[source] == "self"
        t[6] += SOURCES[source] == "running"


class AnchorIndex(SourceStore):
    """Reference backend of the anchor scorer (pure Python); interface of ``ReferenceIndex``."""

    corpus_type = _Corpus

    def __init__(self, *, min_match: int, max_match: int, prompt_tail: int, sources: tuple[str, ...]) -> None:
        self.min_match = min_match
        self.max_match = max_match
        self.prompt_tail = prompt_tail
        self.sources = tuple(s for s in SOURCES if s in sources)
        super().__init__()
        self._requests: dict[str, _Request] = {}
        self._tries = np.zeros((NUM_CLASSES, DEPTH_MAX), dtype=np.int64)
        self._hits = np.zeros((NUM_CLASSES, DEPTH_MAX), dtype=np.int64)
        self._weights = [0.0] * NUM_WEIGHTS  # the re-ranker: classes, bias, slope (starts at 1: the raw score)
        self._weights[-1] = 1.0
        self._rates: dict[int, list[float]] = {}

    # ---- sources (SourceStore's; a corpus is stored oldest first) ---------------------------------------------
    def set_history(self, prompt_id: str, sequences, weights: list[int]) -> None:
        super().set_history(prompt_id, list(sequences)[::-1], list(weights)[::-1])  # the facade passes newest first

    # ---- requests ------------------------------------------------------------------------------------------
    def start(self, req_id: str, prompt_id: str | None, prompt_tokens: list[int]) -> None:
        toks = [int(t) for t in prompt_tokens]
        with self._lock:
            self._requests.pop(req_id, None)  # a restarted request is the newest running one
            self._requests[req_id] = _Request(prompt_id, toks, len(toks))

    def extend(self, req_id: str, tokens: list[int]) -> None:
        req = self._requests[req_id]
        req.context.extend(int(t) for t in tokens)
        with self._lock:
            self._resolve(req, final=False)

    def remove_request(self, req_id: str) -> None:
        with self._lock:
            req = self._requests.pop(req_id, None)
            if req is not None:
                self._resolve(req, final=True)

    def has_request(self, req_id: str) -> bool:
        return req_id in self._requests

    def draft_batch(self, req_ids: list[str], budgets: list[int]):
        with self._lock:
            return [self._draft(self._requests[r], b) for r, b in zip(req_ids, budgets)]

    # ---- drafting (docs/drafting.md section 13) --------------------------------------------------------------
    def _corpora(self, req: _Request) -> list[tuple[int, list[_Corpus]]]:
        """(source index, corpora newest first) per enabled source; self is handled apart."""
        out = []
        pid = req.prompt_id
        for s, name in enumerate(SOURCES):
            if name not in self.sources or name == "self":
                continue
            if name == "history":
                corpora = [self._history[pid]] if pid in self._history else []
            elif name == "siblings":
                corpora = list(self._siblings.get(pid, ()))[::-1] if pid is not None else []
            elif name == "running":
                corpora = self._running(req)
            else:
                corpora = list(self._global.values())[::-1]
            if corpora:
                out.append((s, corpora))
        return out

    def _running(self, req: _Request) -> list[_Corpus]:
        """One corpus per other running request of the prompt, newest started first: its prompt tail and the
        tokens it emitted so far (the sequence a finished sibling stores). Example: a sibling started with prompt
        ``[4, 7]`` that emitted ``[1, 2]`` is ``(7, 1, 2)`` with ``prompt_tail=1``."""
        if req.prompt_id is None:
            return []
        out = []
        for r in reversed(self._requests.values()):
            if r is not req and r.prompt_id == req.prompt_id:
                base = r.prompt_len - min(self.prompt_tail, r.prompt_len)
                out.append(_Corpus.build([r.context[base:]], [1]))
        return out

    def _anchors(self, req: _Request, reach: int) -> list[tuple[int, int, int, int, tuple[int, ...], int, int]]:
        """Every kept anchor as (class, source, kind, rank, sequence, j, length): it drafts ``sequence[j:]``; a
        rewritten one's sequence is its continuation (j = 0)."""
        ctx, n = req.context, len(req.context)
        own = n - req.prompt_len + min(self.prompt_tail, req.prompt_len)  # the request's offset in a stored sequence
        found = []
        for s, corpora in self._corpora(req):
            for kind in (0, 1):
                for rank, (corpus, si, j, length, agree) in enumerate(self._candidates(s, corpora, ctx, kind)):
                    if SOURCES[s] == "global":
                        extra = 0
                    else:
                        extra = _offset_class(abs(j - own)) + (4 * corpus.wclass[si] if SOURCES[s] == "history" else 0)
                    cls = anchor_class(s, kind, length, _ham_class(agree), extra)
                    found.append((cls, s, kind, rank, corpus.seqs[si], j, length))
        if "self" in self.sources:
            s = SOURCES.index("self")
            seq = tuple(ctx)
            for kind in (0, 1):
                for rank, (j, length, agree) in enumerate(self._self_candidates(seq, kind)):
                    cls = anchor_class(s, kind, length, _ham_class(agree), min(rank, 3))
                    found.append((cls, s, kind, rank, seq, j, length))
        return found + self._rewritten(found, ctx, n, reach)

    @staticmethod
    def _rewritten(found, ctx, n: int, reach: int) -> list[tuple[int, int, int, int, tuple[int, ...], int, int]]:
        """The rewritten copies of ``found``'s anchors whose continuation changes: kind + ``REWRITTEN``, the rest of
        the class kept."""
        shift = REWRITTEN * (len(LENGTH_EDGES) + 1) * 4 * NUM_EXTRA  # kind + REWRITTEN in anchor_class
        out = []
        for cls, s, kind, rank, seq, j, length in found:
            cont = rewritten(seq, j, ctx, n, reach)
            if cont is not None:
                out.append((cls + shift, s, kind + REWRITTEN, rank, cont, 0, length))
        return out

    def _candidates(self, s: int, corpora: list[_Corpus], ctx, kind: int):
        """(corpus, seq index, j, length, agreement) of the kept candidates of one source and kind, newest first:
        of the ``SCAN`` newest positions after ``ctx[-1 - kind]``, those matching (section 13.1)."""
        n = len(ctx)
        if n < 1 + kind:
            return []
        key = ctx[n - 1 - kind]
        lmin = SUB_MIN_MATCH if kind else GLOBAL_MIN_MATCH if SOURCES[s] == "global" else self.min_match
        out, seen = [], 0
        for corpus in corpora:
            for si, j in reversed(corpus.postings.get(key, ())):
                if seen == SCAN:
                    return out
                seen += 1
                seq = corpus.seqs[si]
                if kind:
                    j += 1
                    if j >= len(seq) or seq[j - 1] == ctx[n - 1]:
                        continue
                length = _match(seq, j - kind, ctx, n - kind, self.max_match)
                if length >= lmin:
                    out.append((corpus, si, j, length, _agree(seq, j, ctx, n, length + kind)))
        return out

    def _self_candidates(self, ctx: tuple[int, ...], kind: int) -> list[tuple[int, int, int]]:
        """(j, length, agreement) in the request's own context, newest first (never the trivial match at its end)."""
        n = len(ctx)
        out, seen = [], 0
        if n < 2 + kind:
            return out
        key = ctx[n - 1 - kind]
        lmin = SUB_MIN_MATCH if kind else self.min_match
        for jj in range(n - 1 - kind, 0, -1):  # ctx[jj - 1] == key, a next token ctx[jj + kind] exists before n
            if ctx[jj - 1] != key:
                continue
            if seen == SCAN:
                break
            seen += 1
            j = jj + kind
            if kind and ctx[j - 1] == ctx[n - 1]:
                continue
            length = _match(ctx, j - kind, ctx, n - kind, self.max_match)
            if length >= lmin:
                out.append((j, length, _agree(ctx, j, ctx, n, length + kind)))
        return out

    def _rate(self, cls: int) -> list[float]:
        """Learnt hit rate of an anchor of class ``cls`` at each depth: shrunk to the prior, non-increasing."""
        r = self._rates.get(cls)
        if r is None:
            copy = cls // (NUM_EXTRA * 4 * (len(LENGTH_EDGES) + 1)) % NUM_KINDS >= REWRITTEN
            prior = _PRIOR * COPY_PRIOR if copy else _PRIOR
            raw = (self._hits[cls] + RATE_PRIOR_NODES * prior) / (self._tries[cls] + RATE_PRIOR_NODES)
            r = self._rates[cls] = np.minimum.accumulate(raw).tolist()
        return r

    def _draft(self, req: _Request, budget: int):
        empty = ([], [], [], 0, "")
        if budget <= 0:
            return empty
        reach = min(budget, DEPTH_MAX)
        found = self._anchors(req, reach)
        if not found:
            return empty
        keyed = sorted(((-self._rate(a[0])[0], a[1], a[2], a[3], i) for i, a in enumerate(found)))[:MAX_ANCHORS]
        chosen = [found[k[-1]] for k in keyed]
        t = self._trie(chosen, reach)
        score = [1.0]
        for v in range(1, len(t.tok)):
            score.append(min(_sigmoid(self._logit(t.features[v], raw_logit(t.raw(v)))), score[t.par[v]]))
        req.pending.append(_Pending(len(req.context), reach, t.anchors, t.kids, t.depth, t.features, t.raws))
        top = sorted(range(1, len(t.tok)), key=lambda v: (-score[v], t.depth[v], v))[:budget]
        top.sort(key=lambda v: (t.depth[v], v))
        out = {v: i for i, v in enumerate(top)}
        assert all(t.par[v] == 0 or t.par[v] in out for v in top), "a node without its parent"
        parents = [out[t.par[v]] if t.par[v] else -1 for v in top]
        return [t.tok[v] for v in top], parents, [score[v] for v in top], chosen[0][6], "anchors"

    def _trie(self, chosen, reach: int) -> _Trie:
        """The trie of the chosen anchors' continuations, each node with its re-ranker features (section 13.3)."""
        t = _Trie(len(chosen))
        for cls, source, kind, _, seq, j, length in chosen:
            cont = tuple(seq[j : j + reach])
            t.anchors.append((cls, cont))
            rate, v = self._rate(cls), 0
            ham = cls // NUM_EXTRA % 4
            for d, token in enumerate(cont):
                v = t.child(v, token)
                t.add(v, rate[d], length_class(length), ham, kind, source)
        for v in range(1, len(t.tok)):
            t.features.append(
                node_features(t.depth[v], t.raw(v), t.best[v], t.count[v], t.count[t.par[v]], t.tally[v])
            )
            t.raws.append(t.raw(v))
        return t

    def _logit(self, features: tuple[int, ...], logit: float) -> float:
        """The re-ranker's logit of a node: bias + slope * logit(raw score) + its classes' weights, bounded."""
        w = self._weights
        z = w[-2] + w[-1] * logit
        for k, f in enumerate(features):
            z += w[_OFFSETS[k] + f]
        return min(max(z, -LOGIT_MAX), LOGIT_MAX)

    # ---- learning (section 13.4) -----------------------------------------------------------------------------
    def _resolve(self, req: _Request, final: bool) -> None:
        """Learn from every pending draft whose next ``DEPTH_MAX`` tokens are known (all of them when ``final``), in
        (position, reach) order: an anchor tries each depth below the tokens known and the draft's reach, and hits
        where it matched; the re-ranker takes a step."""
        n, keep = len(req.context), []
        for p in sorted(req.pending, key=lambda p: (p.pos, p.reach)):
            avail = min(n - p.pos, DEPTH_MAX)
            if avail < DEPTH_MAX and not final:
                keep.append(p)
                continue
            actual = req.context[p.pos : p.pos + avail]
            seen = min(avail, p.reach)  # depths beyond the draft's budget are no misses
            for cls, cont in p.anchors:
                m = 0
                while m < min(len(cont), seen) and cont[m] == actual[m]:
                    m += 1
                self._tries[cls, :seen] += 1
                self._hits[cls, :m] += 1
                self._rates.pop(cls, None)
            v, hit = 0, set()
            for t in actual:
                v = p.kids[v].get(t, -1)
                if v < 0:
                    break
                hit.add(v)
            self._learn_nodes(p, [u for u in range(1, len(p.depth)) if p.depth[u] <= avail], hit)
        req.pending = keep

    def _learn_nodes(self, p: _Pending, nodes: list[int], hit: set[int]) -> None:
        """One step of the re-ranker on a draft's known nodes: every node's error (hit - predicted, all predicted
        first), each class weight moved by RERANK_LR x the error, node by node, then the bias and the slope by
        RERANK_LR x the mean error (times the node's raw logit)."""
        if not nodes:
            return
        logits = [raw_logit(p.raws[u]) for u in nodes]
        errors = [float(u in hit) - _sigmoid(self._logit(p.features[u], z)) for u, z in zip(nodes, logits)]
        w, total, slope = self._weights, 0.0, 0.0
        for u, e, z in zip(nodes, errors, logits):
            step = RERANK_LR * e
            for k, f in enumerate(p.features[u]):
                w[_OFFSETS[k] + f] += step
            total += e
            slope += e * z
        w[-2] += RERANK_LR * (total / len(nodes))
        w[-1] += RERANK_LR * (slope / len(nodes))

    # ---- accounting and checks -------------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Rough size: 4 bytes per stored token plus 8 per posting, the requests' contexts and the learnt tables."""
        with self._lock:
            corpora = [*self._history.values(), *self._global.values()]
            corpora += [c for group in self._siblings.values() for c in group]
            ctx = sum(len(r.context) for r in self._requests.values())
        tables = self._tries.nbytes + self._hits.nbytes + 8 * NUM_WEIGHTS
        return sum(12 * c.num_tokens() for c in corpora) + 4 * ctx + tables

    def check_integrity(self) -> str | None:
        """None when every posting points at its token and no learnt count exceeds its tries."""
        with self._lock:
            named = [(f"history[{k}]", c) for k, c in self._history.items()]
            named += [(f"global[{k}]", c) for k, c in self._global.items()]
            named += [(f"siblings[{k}]", c) for k, g in self._siblings.items() for c in g]
            if (self._hits > self._tries).any():
                return "a learnt hit count exceeds its tries"
            if not all(math.isfinite(w) for w in self._weights):
                return "a re-ranker weight is not finite"
            if (np.diff(self._tries, axis=1) > 0).any():
                return "tries grow with depth"
        for name, c in named:
            if len(c.seqs) != len(c.wclass):
                return f"{name}: {len(c.seqs)} sequences but {len(c.wclass)} weight classes"
            for t, positions in c.postings.items():
                if any(not (0 < j < len(c.seqs[si])) or c.seqs[si][j - 1] != t for si, j in positions):
                    return f"{name}: a posting of token {t} points elsewhere"
            if sum(len(v) for v in c.postings.values()) != sum(max(len(s) - 1, 0) for s in c.seqs):
                return f"{name}: postings and tokens disagree"
        return None
