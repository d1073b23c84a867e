"""The public drafter: per-prompt history of earlier responses, request-by-request tree drafting.

``HistoSpecDrafter`` keeps validation, steps, visits, weights, LRU, the global FIFO and snapshots; a backend
(``NativeIndex`` or ``ReferenceIndex``; with ``scorer="anchors"``, ``NativeAnchorIndex`` or ``AnchorIndex``) stores
the weighted sequences and drafts. Semantics: docs/drafting.md.

Example::

    d = HistoSpecDrafter(DrafterConfig(prompt_tail=2, backend="python"))
    d.add("p", step=0, responses=[[5, 6, 7], [5, 6, 8], [5, 6, 7]], prompt_tokens=[1, 2])
    d.start("r", "p", [1, 2])
    d.draft("r", budget=4)   # Draft(token_ids=[5, 6, 7, 8], parents=[-1, 0, 1, 1], probs=[1.0, 1.0, 0.66.., 0.33..])
    d.extend("r", [5, 6]); d.finish("r", [5, 6, 7])   # accepted tokens (+ bonus); a sibling now, history at end_step()
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from sglang_histospec.drafting.calibration import CalibrationConfig, DraftCalibration
from sglang_histospec.drafting.reference import ReferenceIndex
from sglang_histospec.drafting.types import COUNTS_SOURCES, MAX_BUDGET, MAX_TOKEN_ID, SOURCES, WEIGHT_ONE, Draft

_WEIGHT_SUM_LIMIT = 2**53
"""Weight sums must stay exactly representable as doubles (docs/drafting.md section 3.1)."""


@dataclass(slots=True)
class DrafterConfig:
    """Configuration of :class:`HistoSpecDrafter`; semantics in ``docs/drafting.md``."""

    window: int = 4
    """K: how many past visits (steps) of a prompt are kept; 1 = the previous epoch only (as RhymeRL)."""
    min_match: int = 1
    """Shortest context suffix that may be matched (back-off stops here)."""
    max_match: int = 32
    """Longest context suffix that is tried first."""
    prompt_tail: int = 4
    """The last ``prompt_tail`` prompt tokens are placed before each stored response (0 = none)."""
    tree: bool = True
    """True: best-first token tree; False: chain mode (one path, RhymeRL's released policy)."""
    min_prob: float = 0.1
    """No node with a path probability below this is drafted."""
    recency_decay: float = 0.5
    """Weight factor per visit back (age); 1.0 switches recency weighting off."""
    reward_weight: float = 0.0
    """Extra weight of a visit's best-rewarded response relative to its worst (min-max normalised); 0.0 = off."""
    use_frequency: bool = True
    """True: counts sum the weights of all occurrences; False: the largest single occurrence weight decides."""
    sources: tuple[str, ...] | None = None
    """Enabled draft sources, a subset of ``SOURCES`` ("history", "siblings", "self", "global", "running"); None =
    all that the scorer supports (the counts scorer has no "running"). Docs: docs/drafting.md sections 6 and 13."""
    capacity_tokens: int = 50_000_000
    """History capacity in tokens (tails included); least-recently-used prompts are evicted whole beyond it."""
    max_prompts: int = 1_000_000
    """At most this many prompt entries (with or without history) are kept; LRU beyond it."""
    global_capacity_tokens: int = 1_000_000
    """Capacity of the global FIFO of recent responses over all prompts (only with "global" in sources)."""
    backend: str = "auto"
    """"native" (C++), "python" (the reference) or "auto" (native when the extension provides it)."""
    scorer: str = "anchors"
    """"counts": the longest match's weighted continuation counts (docs/drafting.md sections 3-6); "anchors": every
    match, scored by hit rates learnt online (section 13; ``tree``, ``min_prob`` and ``use_frequency`` unused)."""
    draft_threads: int = 1
    """Threads the native backend spreads a batch's drafts over (a persistent pool; the drafts do not depend on
    it); the Python reference drafts on one thread."""

    def __post_init__(self) -> None:
        if self.sources is None:
            self.sources = COUNTS_SOURCES if self.scorer == "counts" else SOURCES
        self.sources = tuple(self.sources)
        ints = {
            "window": (self.window, 1),
            "min_match": (self.min_match, 1),
            "max_match": (self.max_match, 1),
            "prompt_tail": (self.prompt_tail, 0),
            "capacity_tokens": (self.capacity_tokens, 0),
            "max_prompts": (self.max_prompts, 1),
            "global_capacity_tokens": (self.global_capacity_tokens, 0),
            "draft_threads": (self.draft_threads, 1),
        }
        for name, (value, low) in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DrafterConfig.{name}={value!r}: expected an int >= {low}")
        if self.max_match < self.min_match:
            raise ValueError(f"DrafterConfig.max_match={self.max_match} < min_match={self.min_match}: raise max_match")
        if not (isinstance(self.min_prob, (int, float)) and 0.0 < self.min_prob <= 1.0):
            raise ValueError(f"DrafterConfig.min_prob={self.min_prob!r}: expected a float in (0, 1]")
        if not (isinstance(self.recency_decay, (int, float)) and 0.0 < self.recency_decay <= 1.0):
            raise ValueError(f"DrafterConfig.recency_decay={self.recency_decay!r}: expected a float in (0, 1]")
        if not (isinstance(self.reward_weight, (int, float)) and 0.0 <= self.reward_weight <= 100.0):
            raise ValueError(f"DrafterConfig.reward_weight={self.reward_weight!r}: expected a float in [0, 100]")
        bad = [s for s in self.sources if s not in SOURCES]
        if bad or len(set(self.sources)) != len(self.sources):
            raise ValueError(f"DrafterConfig.sources={self.sources!r}: expected distinct names from {SOURCES}")
        if self.scorer not in ("counts", "anchors"):
            raise ValueError(f"DrafterConfig.scorer={self.scorer!r}: expected 'counts' or 'anchors'")
        if self.scorer == "counts" and "running" in self.sources:
            raise ValueError(
                f"DrafterConfig.sources={self.sources!r}: the counts scorer has no 'running' source; drop it or set "
                "scorer='anchors'"
            )
        if not self.tree and self.scorer != "counts":
            raise ValueError("DrafterConfig.tree=False: chain mode belongs to the counts scorer; set scorer='counts'")
        if self.backend not in ("auto", "native", "python"):
            raise ValueError(f"DrafterConfig.backend={self.backend!r}: expected 'auto', 'native' or 'python'")
        max_w = math.floor((1.0 + self.reward_weight) * WEIGHT_ONE + 0.5)
        if max(self.capacity_tokens, self.global_capacity_tokens) * max_w >= _WEIGHT_SUM_LIMIT:
            raise ValueError(
                f"DrafterConfig.capacity_tokens={self.capacity_tokens}: weight sums could exceed 2**53 "
                f"(max weight {max_w}); lower capacity_tokens or reward_weight"
            )

    @classmethod
    def rhymerl(cls, **overrides) -> DrafterConfig:
        """RhymeRL's released drafter: chain, match 7 down to 4, min path prob 0.1, previous epoch only, the
        last 5 prompt tokens before each response, history only, frequency counts (use with
        ``BudgetConfig.released()``: x2 / /2 in [2, 16])."""
        base = dict(
            window=1,
            min_match=4,
            max_match=7,
            prompt_tail=5,
            tree=False,
            min_prob=0.1,
            recency_decay=1.0,
            reward_weight=0.0,
            use_frequency=True,
            sources=("history",),
            scorer="counts",
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class _Visit:
    step: int
    responses: list[np.ndarray]  # each [len] int32, without the prompt tail
    rewards: list[float] | None


@dataclass
class _Prompt:
    tail: tuple[int, ...] = ()  # latest known prompt tail (used at the next rebuild)
    visits: list[_Visit] = field(default_factory=list)  # step descending
    tokens: int = 0  # history tokens (tails included) as last built
    built_tail: tuple[int, ...] = ()  # the tail inside the stored sequences


def _check_tokens(tokens, what: str) -> list[int]:
    """Return ``tokens`` as a list of ints; ValueError naming the bad value otherwise."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"{what}: expected a 1-D integer array, got dtype {tokens.dtype} ndim {tokens.ndim}")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= MAX_TOKEN_ID):
            raise ValueError(f"{what}: token ids must lie in [0, 2**31), got min {tokens.min()} max {tokens.max()}")
        return [int(t) for t in tokens]
    if not isinstance(tokens, (list, tuple)):
        raise ValueError(f"{what}: expected a list of token ids, got {type(tokens).__name__}")
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not (0 <= t < MAX_TOKEN_ID):
            raise ValueError(f"{what}: token id {t!r} is not an int in [0, 2**31)")
    return [int(t) for t in tokens]


def _check_id(value, what: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, str):
        raise ValueError(f"{what}={value!r}: expected a str")


def _check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or not (0 <= budget <= MAX_BUDGET):
        raise ValueError(f"budget={budget!r}: expected an int in [0, {MAX_BUDGET}]")
    return int(budget)


def visit_weights(rewards: list[float] | None, n: int, age: int, cfg: DrafterConfig) -> list[int]:
    """Integer weight of each of the ``n`` responses of a visit of the given age (docs/drafting.md section 2).

    Example: ``visit_weights([0.0, 1.0], 2, age=1, cfg)`` with recency_decay 0.5 and reward_weight 1.0
    is ``[32768, 65536]``.
    """
    decay = 1.0
    for _ in range(age):
        decay = decay * cfg.recency_decay
    out = []
    lo = min(rewards) if rewards else 0.0
    hi = max(rewards) if rewards else 0.0
    for i in range(n):
        norm = (rewards[i] - lo) / (hi - lo) if rewards and hi > lo else 0.0
        mult = 1.0 + cfg.reward_weight * norm
        out.append(max(1, math.floor(decay * mult * float(WEIGHT_ONE) + 0.5)))
    return out


def make_index(cfg: DrafterConfig):
    """The backend selected by ``cfg.scorer`` and ``cfg.backend`` (docs/drafting.md section 9): the native one
    when ``backend`` is "native" or "auto" and the extension provides it, else the Python reference."""
    if cfg.scorer == "anchors":
        from sglang_histospec.drafting.anchors import AnchorIndex

        kwargs = dict(
            min_match=cfg.min_match, max_match=cfg.max_match, prompt_tail=cfg.prompt_tail, sources=cfg.sources
        )
        native = _native_class(cfg)
        return native(**kwargs, draft_threads=cfg.draft_threads) if native else AnchorIndex(**kwargs)
    kwargs = dict(
        min_match=cfg.min_match,
        max_match=cfg.max_match,
        tree=cfg.tree,
        min_prob=float(cfg.min_prob),
        use_frequency=cfg.use_frequency,
        sources=cfg.sources,
    )
    native = _native_class(cfg)
    return native(**kwargs, draft_threads=cfg.draft_threads) if native else ReferenceIndex(**kwargs)


def _native_class(cfg: DrafterConfig):
    """The native backend class of ``cfg.scorer``, or None for the Python reference (backend "python", or "auto"
    without the extension); ValueError when backend="native" cannot be honoured."""
    if cfg.backend == "python":
        return None
    try:
        if cfg.scorer == "anchors":
            from sglang_histospec.drafting.native_anchors import NativeAnchorIndex as native
        else:
            from sglang_histospec.drafting.native import NativeIndex as native
    except (ImportError, AttributeError) as exc:
        if cfg.backend == "native":
            raise ValueError(
                f"backend='native' but the native index of scorer={cfg.scorer!r} is unavailable ({exc}); build it "
                "with `make install` or use backend='python'"
            ) from exc
        return None
    return native


class HistoSpecDrafter:
    """History-based tree drafter; see the module docstring for a worked example and ``docs/drafting.md``."""

    def __init__(self, cfg: DrafterConfig | None = None, calibration: CalibrationConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else DrafterConfig()
        self.calibration = DraftCalibration(calibration)
        """Drafted probability -> expected acceptance, fed by whoever verifies the drafts (engine, replay, plugin)."""
        self._index = make_index(self.cfg)
        self.backend = getattr(self._index, "backend", "python")
        """"native" or "python": the backend ``make_index`` chose (native classes say so in ``backend``)."""
        self._lock = threading.RLock()
        self._prompts: OrderedDict[str, _Prompt] = OrderedDict()  # LRU order: last = most recently used
        self._history_tokens = 0
        self._requests: dict[str, tuple[str | None, tuple[int, ...]]] = {}  # req_id -> (prompt_id, tail)
        self._open_step = 0
        self._recorded: OrderedDict[str, list[np.ndarray]] = OrderedDict()  # open step: prompt -> responses
        self._recorded_tails: dict[str, list[tuple[int, ...]]] = {}
        self._global: OrderedDict[tuple[str, int], tuple[int, int, list[np.ndarray]]] = OrderedDict()
        self._global_tokens = 0
        self._global_key = 0
        self._counters = {"drafts": 0, "drafted_tokens": 0, "evicted_prompts": 0}

    # ---- history -------------------------------------------------------------------------------------------
    def add(
        self,
        prompt_id: str,
        step: int,
        responses: list[list[int]],
        rewards: list[float] | None = None,
        prompt_tokens: list[int] | None = None,
    ) -> int:
        """Store a step's group of responses for a prompt; returns how many responses were stored.

        A visit with a step the prompt already has replaces it; only the ``window`` largest steps are kept.
        Example: ``d.add("gsm-1", 3, [[5, 6], []], rewards=[1.0, 0.0]) == 1`` (empty responses are skipped).
        """
        _check_id(prompt_id, "prompt_id")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step={step!r}: expected an int >= 0")
        if not isinstance(responses, (list, tuple)):
            raise ValueError(f"responses: expected a list of token lists, got {type(responses).__name__}")
        if rewards is not None:
            if not isinstance(rewards, (list, tuple)) or len(rewards) != len(responses):
                raise ValueError(f"rewards={rewards!r:.100}: expected None or {len(responses)} floats")
            for r in rewards:
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
                    raise ValueError(f"reward {r!r} is not a finite float")
        arrays, kept_rewards = [], []
        for i, resp in enumerate(responses):
            toks = _check_tokens(resp, f"responses[{i}]")
            if toks:
                arrays.append(np.asarray(toks, dtype=np.int32))
                if rewards is not None:
                    kept_rewards.append(float(rewards[i]))
        tail = None if prompt_tokens is None else _check_tokens(prompt_tokens, "prompt_tokens")
        if not arrays:
            return 0
        with self._lock:
            entry = self._touch(prompt_id)
            if tail is not None:
                entry.tail = self._tail_of(tail)
            stored = self._put_visit(prompt_id, entry, _Visit(int(step), arrays, kept_rewards or None), True)
            self._evict()
            return stored

    def has_visit(self, prompt_id: str, step: int) -> bool:
        """True when the history holds responses of ``prompt_id`` for ``step`` (a push for it replaces them).
        Example: after ``d.add("p", 3, [[5, 6]])``, ``d.has_visit("p", 3)`` is True."""
        with self._lock:
            entry = self._prompts.get(prompt_id)
            return entry is not None and any(v.step == step for v in entry.visits)

    def end_step(self, step: int | None = None) -> None:
        """Close the open step: its recorded responses become history unless a push covered them."""
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0):
            raise ValueError(f"step={step!r}: expected None or an int >= 0")
        with self._lock:
            s = self._open_step if step is None else int(step)
            for prompt_id, responses in self._recorded.items():
                entry = self._touch(prompt_id)
                if any(v.step == s for v in entry.visits):
                    continue
                self._put_visit(prompt_id, entry, _Visit(s, responses, None), False)
            self._recorded = OrderedDict()
            self._recorded_tails = {}
            self._index.clear_siblings()
            self._open_step = s + 1
            self._evict()

    def _put_visit(self, prompt_id: str, entry: _Prompt, visit: _Visit, replace: bool) -> int:
        visits = [v for v in entry.visits if v.step != visit.step]
        if len(visits) != len(entry.visits) and not replace:
            return 0
        visits.append(visit)
        visits.sort(key=lambda v: -v.step)
        kept = visits[: self.cfg.window]
        entry.visits = kept
        self._rebuild(prompt_id, entry)
        if not any(v is visit for v in kept):
            return 0
        if "global" in self.cfg.sources:
            self._global_put(prompt_id, visit.step, [self._seq(entry.tail, r) for r in visit.responses])
        return len(visit.responses)

    def _rebuild(self, prompt_id: str, entry: _Prompt) -> None:
        seqs, weights = [], []
        for age, v in enumerate(entry.visits):
            seqs += [self._seq(entry.tail, r) for r in v.responses]
            weights += visit_weights(v.rewards, len(v.responses), age, self.cfg)
        self._history_tokens += sum(len(s) for s in seqs) - entry.tokens
        entry.tokens = sum(len(s) for s in seqs)
        entry.built_tail = entry.tail
        self._index.set_history(prompt_id, seqs, weights)

    @staticmethod
    def _seq(tail: tuple[int, ...], response: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate([np.asarray(tail, dtype=np.int32), response]))

    def _tail_of(self, prompt_tokens) -> tuple[int, ...]:
        n = self.cfg.prompt_tail
        return tuple(prompt_tokens[len(prompt_tokens) - n :]) if n else ()

    def _touch(self, prompt_id: str) -> _Prompt:
        entry = self._prompts.get(prompt_id)
        if entry is None:
            entry = self._prompts[prompt_id] = _Prompt()
        self._prompts.move_to_end(prompt_id)
        return entry

    def _evict(self) -> None:
        while self._prompts and (
            self._history_tokens > self.cfg.capacity_tokens or len(self._prompts) > self.cfg.max_prompts
        ):
            prompt_id, entry = self._prompts.popitem(last=False)
            self._history_tokens -= entry.tokens
            if entry.tokens:
                self._index.set_history(prompt_id, [], [])
                self._counters["evicted_prompts"] += 1

    def _global_put(self, prompt_id: str, step: int, seqs: list[np.ndarray]) -> None:
        old = self._global.pop((prompt_id, step), None)
        if old is not None:
            self._index.remove_global(old[0])
            self._global_tokens -= old[1]
        key, self._global_key = self._global_key, self._global_key + 1
        ntok = sum(len(s) for s in seqs)
        self._global[(prompt_id, step)] = (key, ntok, seqs)
        self._global_tokens += ntok
        self._index.add_global(key, seqs, [WEIGHT_ONE] * len(seqs))
        while self._global and self._global_tokens > self.cfg.global_capacity_tokens:
            _, (k, n, _) = self._global.popitem(last=False)
            self._index.remove_global(k)
            self._global_tokens -= n

    # ---- requests ------------------------------------------------------------------------------------------
    def start(self, req_id: str, prompt_id: str | None, prompt_tokens: list[int]) -> None:
        """Begin a request; ``prompt_id=None`` means no history (only the self/global sources)."""
        _check_id(req_id, "req_id")
        _check_id(prompt_id, "prompt_id", allow_none=True)
        toks = _check_tokens(prompt_tokens, "prompt_tokens")
        tail = self._tail_of(toks)
        with self._lock:
            if req_id in self._requests:
                raise ValueError(f"req_id={req_id!r} is already started; finish() or abort() it first")
            if prompt_id is not None:
                self._touch(prompt_id).tail = tail
                self._evict()
            self._requests[req_id] = (prompt_id, tail)
            self._index.start(req_id, prompt_id, toks)

    def extend(self, req_id: str, tokens: list[int]) -> None:
        """Append the tokens emitted since the last call (accepted draft tokens plus the bonus token)."""
        self._known(req_id)
        self._index.extend(req_id, _check_tokens(tokens, "tokens"))

    def extend_batch(self, req_ids: list[str], tokens: list[list[int]]) -> None:
        """``extend`` for several requests at once (an engine step), validated in one pass."""
        if len(req_ids) != len(tokens):
            raise ValueError(f"{len(req_ids)} req_ids but {len(tokens)} token lists: pass one list per request")
        requests = self._requests
        if not all(r in requests for r in req_ids):
            for r in req_ids:
                self._known(r)
        flat = [t for toks in tokens for t in toks]
        if flat and not (all(type(t) is int for t in flat) and min(flat) >= 0 and max(flat) < MAX_TOKEN_ID):
            for toks in tokens:
                _check_tokens(toks, "tokens")
        extend = self._index.extend
        for r, toks in zip(req_ids, tokens):
            extend(r, toks)

    def draft(self, req_id: str, budget: int) -> Draft:
        """A tree of at most ``budget`` nodes for the request's current context (``Draft.empty()`` if none)."""
        return self.draft_batch([req_id], [budget])[0]

    def draft_batch(self, req_ids: list[str], budgets: list[int]) -> list[Draft]:
        """One draft per request; the native backend drafts the whole batch without the GIL."""
        if len(req_ids) != len(budgets):
            raise ValueError(f"{len(req_ids)} req_ids but {len(budgets)} budgets: pass one budget per request")
        checked = [b if type(b) is int and 0 <= b <= MAX_BUDGET else _check_budget(b) for b in budgets]
        requests = self._requests
        if not all(r in requests for r in req_ids):
            for r in req_ids:
                self._known(r)
        out = []
        empty = Draft.empty()
        for toks, parents, probs, match_len, source in self._index.draft_batch(list(req_ids), checked):
            out.append(Draft(toks, parents, probs, match_len, source) if toks else empty)
        self._counters["drafts"] += len(out)
        self._counters["drafted_tokens"] += sum(len(d) for d in out)
        return out

    def finish(self, req_id: str, response: list[int]) -> None:
        """End a request; its whole ``response`` becomes a sibling now and history at ``end_step``."""
        self._known(req_id)
        toks = _check_tokens(response, "response")
        with self._lock:
            prompt_id, tail = self._requests.pop(req_id)
            self._index.remove_request(req_id)
            if prompt_id is None or not toks:
                return
            arr = np.asarray(toks, dtype=np.int32)
            self._recorded.setdefault(prompt_id, []).append(arr)
            self._recorded_tails.setdefault(prompt_id, []).append(tail)
            self._index.add_sibling(prompt_id, self._seq(tail, arr), WEIGHT_ONE)

    def abort(self, req_id: str) -> None:
        """Forget a request without recording its output."""
        self._known(req_id)
        with self._lock:
            self._requests.pop(req_id, None)
            self._index.remove_request(req_id)

    def _known(self, req_id: str) -> None:
        if req_id not in self._requests:
            raise ValueError(f"unknown req_id={req_id!r}: call start() first (or it already finished)")

    # ---- introspection -------------------------------------------------------------------------------------
    def active_requests(self) -> set[str]:
        """Ids of started, not yet finished or aborted requests (to reconcile with an engine's live batch)."""
        with self._lock:
            return set(self._requests)

    @property
    def open_step(self) -> int:
        return self._open_step

    def prompt_sizes(self) -> dict[str, int]:
        """History tokens (tails included) per prompt that has history."""
        with self._lock:
            return {p: e.tokens for p, e in self._prompts.items() if e.tokens}

    def memory_bytes(self) -> int:
        """Bytes held: the backend's structures plus the facade's int32 token copies."""
        with self._lock:
            own = 4 * (self._history_tokens + self._global_tokens)
            own += 4 * sum(len(r) for rs in self._recorded.values() for r in rs)
        return own + int(self._index.memory_bytes())

    def stats(self) -> dict:
        """Counters: prompts, history_tokens, memory_bytes, requests, open_step, siblings, global_tokens, ..."""
        with self._lock:
            return {
                "backend": self.backend,
                "prompts": sum(1 for e in self._prompts.values() if e.tokens),
                "history_tokens": self._history_tokens,
                "memory_bytes": self.memory_bytes(),
                "requests": len(self._requests),
                "open_step": self._open_step,
                "siblings": sum(len(v) for v in self._recorded.values()),
                "global_tokens": self._global_tokens,
                **self._counters,
            }

    def check_integrity(self) -> str | None:
        """None when the facade's bookkeeping and the backend's structures are consistent."""
        with self._lock:
            total = 0
            for p, e in self._prompts.items():
                steps = [v.step for v in e.visits]
                if steps != sorted(set(steps), reverse=True) or len(steps) > self.cfg.window:
                    return f"prompt {p!r}: visit steps {steps} not distinct, descending and within the window"
                size = sum(len(e.built_tail) + len(r) for v in e.visits for r in v.responses)
                if size != e.tokens:
                    return f"prompt {p!r}: {e.tokens} tokens recorded but {size} stored"
                total += size
            if total != self._history_tokens:
                return f"history_tokens {self._history_tokens} != sum over prompts {total}"
            if self._history_tokens > self.cfg.capacity_tokens:
                return f"history_tokens {self._history_tokens} > capacity {self.cfg.capacity_tokens}"
            g = sum(n for _, n, _ in self._global.values())
            if g != self._global_tokens or g > self.cfg.global_capacity_tokens:
                return f"global tokens {self._global_tokens} (recount {g}) inconsistent or over capacity"
        return self._index.check_integrity()

    # ---- snapshot ------------------------------------------------------------------------------------------
    def snapshot(self, path, extra: dict | None = None) -> None:
        """Write the history (not the running requests) to ``path``: versioned, checksummed, atomic. ``extra``: a
        small JSON dict stored with it (``read_snapshot(path)["extra"]``)."""
        from sglang_histospec.drafting.snapshot import write_snapshot

        with self._lock:
            write_snapshot(path, {**self._export(), "extra": extra or {}})

    @classmethod
    def load(cls, path, cfg: DrafterConfig | None = None) -> HistoSpecDrafter:
        """A new drafter holding the history of a snapshot; ValueError if the file is corrupt or truncated."""
        from sglang_histospec.drafting.snapshot import read_snapshot

        return cls.from_state(read_snapshot(path), cfg)  # fully parsed and verified before anything is built

    @classmethod
    def from_state(cls, state: dict, cfg: DrafterConfig | None = None) -> HistoSpecDrafter:
        """A new drafter holding ``state`` as ``read_snapshot`` returns it."""
        d = cls(cfg)
        d._import(state)
        return d

    def _export(self) -> dict:
        return {
            "open_step": self._open_step,
            "prompts": [
                (p, list(e.built_tail if e.visits else e.tail), [(v.step, v.responses, v.rewards) for v in e.visits])
                for p, e in self._prompts.items()
            ],
            "recorded": [(p, list(zip(self._recorded_tails[p], rs, strict=True))) for p, rs in self._recorded.items()],
            "global": [(p, s, seqs) for (p, s), (_, _, seqs) in self._global.items()],
        }

    def _import(self, state: dict) -> None:
        with self._lock:
            if "global" in self.cfg.sources:
                for p, s, seqs in state["global"]:
                    self._global_put(p, s, seqs)
            for p, tail, visits in state["prompts"]:
                entry = self._touch(p)
                entry.tail = tuple(tail[len(tail) - self.cfg.prompt_tail :]) if self.cfg.prompt_tail else ()
                entry.visits = sorted((_Visit(s, rs, rw) for s, rs, rw in visits), key=lambda v: -v.step)
                entry.visits = entry.visits[: self.cfg.window]
                self._rebuild(p, entry)
            self._evict()
            for p, items in state["recorded"]:
                for tail, arr in items:
                    self._recorded.setdefault(p, []).append(arr)
                    self._recorded_tails.setdefault(p, []).append(tuple(tail))
                    self._index.add_sibling(p, self._seq(tuple(tail), arr), WEIGHT_ONE)
            self._open_step = int(state["open_step"])
