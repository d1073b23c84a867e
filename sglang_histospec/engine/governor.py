"""A measured guard against drafting that does not pay: compare real tokens/s with and without drafting.

Per batch-size bucket ``SpecGovernor`` lets a step draft only while drafting steps are measured at least as fast as
plain ones, probing the losing mode now and then (rules: its class docstring; docs/drafting.md section 10).

Example::

    g = SpecGovernor()
    g.use_spec(16)                 # True: no measurements yet (drafting first, then a plain baseline)
    g.observe(16, drafted=True, tokens=16, seconds=1.0)   # a drafting step that emitted one token a request
"""

from __future__ import annotations

import collections
import math
import sys
from dataclasses import dataclass, field

from sglang_histospec.drafting.draft_cut import StepCostConfig, StepCostModel

PROBE_ROOM_MAX = 4.0
"""Most plain steps of room the explore budget asks for before a probe of drafting (its measured excess, capped)."""

PLAIN_REFIT = 128
"""Plain steps between two refits of the governor's fit of plain step times (each refit is a 4x4 solve)."""

WALL_WINDOW = 64
"""Plain steps whose longest wall time bounds each step of a countdown (``SpecGovernor._steps_plain``)."""

PLAIN_QUEUE_MAX = 64
"""Plain steps ``observe`` queues before it folds them in (they are folded at every decision that reads them too)."""

PROBE_HOST_S = (1e-3, 50e-6)
"""Host seconds a probe of drafting is expected to cost before one was measured (asking the drafter, laying out and
verifying a tree), a step's and each request's, on top of its capped rows: the first probe in a bucket waits for room
for ``probe_cost`` plain steps plus that, which matters where a step is short (a small model, a large batch)."""

TRUST_MARGIN = 0.01
"""Log ratio a re-check of trusted drafting leaves when it withdraws the trust: just below parity, so that the next
probe of drafting that wins (a capped, small tree) restores it, while a probe that loses pushes it further down."""


@dataclass(slots=True)
class GovernorConfig:
    """Settings of :class:`SpecGovernor`."""

    min_samples: int = 4
    """Steps of each mode measured in a bucket before the governor decides there."""
    decay: float = 0.8
    """Weight of the old mean in each update of a decayed mean (per observed step)."""
    probe_every: int = 16
    """Steps of the winning mode between two probes of the losing one (the first interval)."""
    max_probe_interval: int = 64
    """Longest interval between probes of drafting while plain steps keep winning."""
    probe_cost: float = 0.25
    """A drafting step the governor does not yet trust (a probe, or one before drafting was measured to win in its
    bucket) verifies at most this fraction of the step's modelled cost in draft rows: the cut's best nodes only,
    so a probe of drafting that loses costs at most that much more than a plain step."""
    ramp_max: float = 64.0
    """A trusted drafting step keeps at most ``probe_cost`` x its cost in draft rows times a ramp that starts at 1 at
    each new history step, doubles after each drafting step whose accepted nodes paid for its draft rows (by the
    step model) and that ran at least as fast as the bucket's plain steps, and halves after each other one, up to
    this multiple: trust measured on a probe's small tree is extended to larger trees one paying step at a time."""
    trusted_weight: float = 0.25
    """Weight of each drafting step the governor trusts in the measured ratio (against the last plain mean, which
    may be older: contexts grow, so it errs towards plain decoding), so a drafter that stops paying loses the trust
    within a few steps instead of at the next probe of plain decoding (0 = only probes update the ratio)."""
    scale_decay: float = 0.5
    """Per drafting step, the weight of the past in the decayed sums of accepted and predicted draft nodes whose
    ratio scales the calibrated probabilities the cut weighs (the policy's acceptance scale; 0 = the last step
    only)."""
    scale_prior: float = 4.0
    """Predicted nodes of ratio 1 the acceptance scale starts from at each new history step."""
    history_probe: bool = True
    """After each new history step (``forget_drafting``), the explore budget is sized from the start by the decode
    time of the history step that just ended (the next RL step is expected to last about as long), and in each
    bucket the first drafting step replaces the drafting mean instead of being averaged with it: the new history
    may pay where the last did not, a short RL step (a few hundred decode steps) ends before a fraction
    ``explore_budget`` of its own decode time pays for a probe, and a probe averaged with the last history's losing
    ones loses even when it wins. A probe whose measured cost the last step's budget does not cover (a small
    model's steps of a few milliseconds, where a probe's host work is a large share) still waits for room."""
    wall_cap: float = 0.1
    """A drafting step's decode seconds count in its bucket's rates (the decisions, not the budget) as at most
    ``1 + wall_cap`` times what it should cost: the plain fit's step for its batch plus the cost beyond it that
    the caller models (``observe``'s ``extra_s``: its extra rows and its drafting host work). One probe decides for
    up to ``max_probe_interval`` steps, and a noise spike of the machine on it (a plain step of the same batch can
    take twice its median) would switch drafting off that long. The explore budget counts the wall as measured,
    so the guarantee stands (the room a bucket's next probe waits for, a prediction of its cost, is measured on the
    capped seconds too). ``math.inf``: rates from the measured seconds."""
    explore_budget: float = 0.01
    """The guarantee behind the buckets' decisions: since the last history step, drafting steps together may have
    run at most this fraction of the engine's decode time longer than plain steps would have taken for the tokens
    they emitted (by a fit of this engine's own plain steps, which come first); past it, every step decodes plainly
    until the time of later steps makes room again (a drafting step that wins adds room). ``math.inf``: no limit."""

    def __post_init__(self) -> None:
        if self.min_samples < 1 or self.probe_every < 1 or self.max_probe_interval < self.probe_every:
            raise ValueError(
                f"GovernorConfig(min_samples={self.min_samples}, probe_every={self.probe_every}, "
                f"max_probe_interval={self.max_probe_interval}): need min_samples, probe_every >= 1 and "
                "max_probe_interval >= probe_every"
            )
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"GovernorConfig.decay={self.decay}: use a value in [0, 1)")
        if not 0.0 <= self.trusted_weight < 1.0:
            raise ValueError(f"GovernorConfig.trusted_weight={self.trusted_weight}: use a value in [0, 1)")
        if not self.ramp_max >= 1.0:
            raise ValueError(f"GovernorConfig.ramp_max={self.ramp_max}: use a value >= 1 (math.inf: no limit)")
        if not 0.0 <= self.scale_decay < 1.0 or not self.scale_prior > 0.0:
            raise ValueError(
                f"GovernorConfig(scale_decay={self.scale_decay}, scale_prior={self.scale_prior}): use scale_decay in "
                "[0, 1) and scale_prior > 0"
            )
        if not self.probe_cost > 0.0:
            raise ValueError(f"GovernorConfig.probe_cost={self.probe_cost}: use a value > 0 (math.inf: no cap)")
        if not self.wall_cap >= 0.0:
            raise ValueError(f"GovernorConfig.wall_cap={self.wall_cap}: use a value >= 0 (math.inf: no cap)")
        if not self.explore_budget >= 0.0:
            raise ValueError(f"GovernorConfig.explore_budget={self.explore_budget}: use a value >= 0 (math.inf: none)")


def critical_progress(rooms: list[int], emitted: list[int]) -> int:
    """Steps by which one decode step brought forward the end of a batch that nothing waits to join, bounded by its
    requests' caps: ``rooms[i]`` tokens request i may still emit before the step (``max_new_tokens`` less its
    output), ``emitted[i]`` tokens the step gave it (>= 1). The batch runs at most ``max(rooms)`` more steps before
    and ``max(rooms[i] - emitted[i])`` after; a plain step brings that bound forward by 1.

    Example: ``critical_progress([90, 96, 96], [3, 2, 1])`` is 1: a request with 96 tokens of room still got one.
    """
    after = max(r - min(e, r) for r, e in zip(rooms, emitted))
    return max(rooms) - after


def _bucket(bsz: int) -> int:
    """The batch-size bucket of ``bsz`` (its bit length: 1, 2-3, 4-7, ...)."""
    return int(bsz).bit_length()


@dataclass(slots=True)
class _Bucket:
    rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [plain, spec] decayed tokens/s
    count: list[int] = field(default_factory=lambda: [0, 0])  # steps observed per mode
    since_probe: int = 0  # winner steps since the last probe of the loser
    interval: int = 0  # current probe interval (0 = not yet set)
    probing: bool = False  # the last decision was a probe of drafting, not yet observed as a drafting step
    steps: int = 0  # observed steps in this bucket
    last: list[int] = field(default_factory=lambda: [0, 0])  # step count at each mode's last observation
    log_ratio: float | None = None  # decayed mean of log(drafting / plain tokens/s), probes against the winner
    won: bool = False  # drafting was measured to win here at some history step (kept by forget_drafting)
    probe_excess: float | None = None  # decayed excess of its drafting steps before a win, seconds (kept)

    def spec_wins(self) -> bool:
        return self.rate[1] >= self.rate[0] if self.log_ratio is None else self.log_ratio >= 0.0


class SpecGovernor:
    """Decides per step whether to draft, from measured tokens/s per batch-size bucket.

    The cost-aware cut (``drafting/draft_cut.py``) predicts whether draft nodes pay for their verify rows; a
    prediction can be wrong (host work it does not model, a noisy machine, a cold history). The governor measures
    instead. Per batch size bucket (``bsz.bit_length()``) it keeps a decayed mean of the tokens per second of steps
    that drafted and of steps that did not, and lets a step draft only while drafting steps are measured at least as
    fast. The losing mode is probed now and then, so either side can win back: plain steps every ``probe_every``
    drafting steps, drafting steps after ``probe_every`` plain steps, the interval doubling (up to
    ``max_probe_interval``) while probes lose. A probe of drafting that did not draft (nothing matched, or the cut
    kept no node) is repeated at the next step.

    A probe is judged against the winning mode's rate *at the time of the probe*: the bucket keeps the measured ratio
    of drafting over plain tokens/s, updated only by observations of the losing mode, each divided by the winner's
    current mean. Comparing two absolute means instead would compare a fresh one with a stale one, and step times
    drift within an epoch (contexts grow, prefills merge in): a plain rate falling below an old drafting rate would
    read as a win for drafting that no step measured. Drafting steps the governor trusts are re-checked too, with
    less weight (``trusted_weight``), against the plain mean: a stale plain mean errs towards plain decoding, the
    safe side, and a drafter that stops paying is caught within a few steps, not at the next probe.
    """

    def __init__(self, config: GovernorConfig | None = None) -> None:
        self.cfg = config or GovernorConfig()
        self._buckets: dict[int, _Bucket] = {}
        self.stats = {"governed_plain_steps": 0, "probes": 0, "budget_plain_steps": 0}
        # plain s = a + b * bsz, refitted every PLAIN_REFIT steps: its coefficients drift slowly, and plain steps must
        # cost no more host time than the plain engine's
        self._plain = StepCostModel(StepCostConfig(min_steps=max(3, self.cfg.min_samples), refit_every=PLAIN_REFIT))
        self._excess = 0.0  # drafting steps' seconds beyond the plain fit's for their tokens, since the history step
        self._decode_s = 0.0  # seconds of every decode step since the history step
        self._probe_excess: float | None = None  # the last measured probe excess (any bucket), in plain steps
        self._carry = 0.0  # decode seconds of the last history step: the budget's size from the start (history_probe)
        # a plain step costs the governor what it costs a plain engine, about nothing: its observation is queued
        # (``_flush`` folds them in, in order, before anything reads the state) and, while the budget is known to be
        # short, or the bucket's rules decode plainly until the next probe, ``use_spec`` counts down instead of
        # deciding again, in each bucket on its own (a batch that moves between two buckets, 63 and 64 requests, keeps
        # both countdowns): ``_skips[bucket] = (own steps left, last step it holds for, rules)``, ``rules`` the bucket
        # when by its rules, None when by the budget; ``_steps`` counts the observed steps (any bucket's)
        self._queue: list[tuple[int, int, float, int, float]] = []
        self._skips: dict[int, tuple[int, int, _Bucket | None]] = {}
        self._steps = 0
        self._walls: collections.deque[float] = collections.deque(maxlen=WALL_WINDOW)  # the last plain steps' walls
        self._wall_hi = 0.0  # the longest of them: a countdown's bound on each step's wall time

    def use_spec(self, bsz: int) -> bool:
        """Whether the next step of a batch of ``bsz`` requests may draft."""
        skip = self._skips.pop(bsz.bit_length(), None)
        if skip is not None and self._steps < skip[1]:  # decided already (``_countdown``)
            left, until, rules = skip
            if left > 1:
                self._skips[bsz.bit_length()] = (left - 1, until, rules)
            if rules is None:
                self.stats["budget_plain_steps"] += 1
            else:
                rules.since_probe += 1
                self.stats["governed_plain_steps"] += 1
            return False
        if not self.within_budget(bsz):
            self._countdown(bsz, None)
            self.stats["budget_plain_steps"] += 1
            return False
        b = self._bucket_of(bsz)  # (within_budget folded the queued steps in)
        n = self.cfg.min_samples
        if b.count[1] < n:
            return True
        if b.count[0] < n:
            self.stats["governed_plain_steps"] += 1
            return False
        if b.log_ratio is None:  # both modes measured: the first comparison of their means
            b.log_ratio = math.log(max(b.rate[1], 1e-12) / max(b.rate[0], 1e-12))
        spec_wins = b.spec_wins()
        b.won = b.won or spec_wins
        if b.interval == 0:
            b.interval = self.cfg.probe_every
        b.since_probe += 1
        probe = b.since_probe >= b.interval or (b.probing and not spec_wins)  # a probe that did not draft: again
        if probe:
            b.since_probe = 0
            self.stats["probes"] += 1
            if not spec_wins:  # drafting lost again since the last probe: wait longer before the next
                b.interval = min(2 * b.interval, self.cfg.max_probe_interval)
        if spec_wins:
            b.interval = self.cfg.probe_every
        use = spec_wins != probe
        b.probing = use and not spec_wins
        self.stats["governed_plain_steps"] += not use
        if not (use or spec_wins):  # plain by the bucket's rules until its next probe
            self._countdown(bsz, b)
        return use

    def within_budget(self, bsz: int | None = None) -> bool:
        """Whether drafting may run now under ``explore_budget``: the plain fit measured and the excess within the
        budget (of the decode time since the last history step, or, with ``history_probe``, of the last history
        step's if longer); for a step of ``bsz`` requests in a bucket where drafting was never measured to win, with
        room left for a probe: the excess over the plain fit that its drafting steps were measured to cost before
        they won (decayed; host work included, which the probe's row cap does not bound; ``_probe_room``)."""
        return self._room(bsz) >= 0.0

    def _room(self, bsz: int | None) -> float:
        """Seconds of drafting excess the budget allows now (``within_budget``'s rule; < 0: none, -inf before the
        plain fit is ready)."""
        self._flush()
        if math.isinf(self.cfg.explore_budget):
            return math.inf
        if not self._plain.ready:
            return -math.inf
        room = self.cfg.explore_budget * max(self._decode_s, self._carry) - self._excess
        if bsz is not None:
            b = self._buckets.get(_bucket(bsz))
            if b is None or not b.won:  # a bucket where drafting never won: room for a probe
                room -= self._probe_room(bsz, b)
        return room

    def _probe_room(self, bsz: int, b: _Bucket | None) -> float:
        """Seconds of room a probe of drafting at ``bsz`` waits for (``within_budget``): what the bucket's probes
        were measured to cost, else the capped rows and the expected host work (``PROBE_HOST_S``), or the last
        measured excess of another bucket in plain steps if more, at most ``PROBE_ROOM_MAX`` plain steps. Never less
        for a larger batch of the same bucket (the countdowns rely on it)."""
        if b is not None and b.probe_excess is not None:
            return b.probe_excess
        step = self._plain.base_cost(bsz)
        fixed, per_request = PROBE_HOST_S
        room = min(self.cfg.probe_cost, 1.0) * step + fixed + per_request * bsz
        if self._probe_excess is not None:
            room = max(room, self._probe_excess * step)
        return min(room, PROBE_ROOM_MAX * step)

    def _countdown(self, bsz: int, rules: _Bucket | None) -> None:
        """After a plain decision for ``bsz`` (by the budget, or by the rules of bucket ``rules``), the steps of the
        same bucket that ``use_spec`` may decide alike without deciding again: as many as certainly give the same
        decision (``_steps_plain``)."""
        own, steps = self._steps_plain(bsz, rules)
        if min(own, steps) > 0:  # valid for the bucket's next ``own`` steps among the next ``steps`` of any bucket
            self._skips[_bucket(bsz)] = (own, self._steps + steps + 1, rules)

    def _steps_plain(self, bsz: int, rules: _Bucket | None) -> tuple[int, int]:
        """``(own, steps)``: the next ``own`` steps of ``bsz``'s bucket, among the next ``steps`` steps of any bucket,
        certainly decode plainly as this one did, if they are plain: each plain step (any bucket's) adds to the room
        at most ``explore_budget`` x the longest of the last ``WALL_WINDOW`` plain steps (a longer one ends the
        countdown) and at least nothing, the bucket's smallest batch needs the least room for a probe and its largest
        the most, and the plain fit, where it prices that room, is fixed until its next refit. By the budget: while
        the room stays short; by the rules: until the bucket's next probe, while the room stays."""
        b = rules if rules is not None else self._buckets.get(_bucket(bsz))
        # the room is priced by the plain fit (a budget, and a bucket whose probes were never measured nor won)
        fitted = math.isfinite(self.cfg.explore_budget) and (b is None or not (b.won or b.probe_excess is not None))
        refit = self._plain.steps_to_refit() if fitted else math.inf
        if rules is None:
            short = -self._room(1 << (bsz.bit_length() - 1))
            grow = self.cfg.explore_budget * self._wall_hi
            if not math.isfinite(short):  # the plain fit not ready: decide again at the next step
                steps = 0
            elif grow > 0.0:
                steps = int(short / grow) - 1  # (a step's margin)
            else:  # no budget (explore_budget 0): plain steps add no room, plain until the refit or a history step
                steps = sys.maxsize
            own = steps
        else:
            own = rules.interval - rules.since_probe - 1
            if own > 0 and self._room((1 << bsz.bit_length()) - 1) < 0.0:
                own = 0
            steps = refit - 1 if math.isfinite(refit) else sys.maxsize  # other buckets' steps: until the refit
        return max(0, int(min(own, refit - 1))), max(0, int(min(steps, refit - 1)))

    def trusts_spec(self, bsz: int) -> bool:
        """Whether drafting was measured to win in the bucket of ``bsz`` (after both modes were compared); a
        drafting step that is not trusted is a probe, whose draft rows the policy caps (``probe_cost``)."""
        self._flush()
        b = self._buckets.get(_bucket(bsz))
        return b is not None and b.log_ratio is not None and b.spec_wins()

    def forget_drafting(self) -> None:
        """Let drafting be measured again at once in every bucket (call when the history changed: a new step's
        drafts may pay where the last step's did not). One fresh drafting step per bucket decides, so a drafter that
        still does not pay costs one step, not ``min_samples``; it is weighed as much as the old mean, or, with
        ``history_probe``, replaces it. The explore budget starts again (with ``history_probe``, sized by the decode
        time since the last history step)."""
        self._flush()
        n = self.cfg.min_samples
        self._carry = self._decode_s if self.cfg.history_probe else 0.0
        self._excess, self._decode_s = 0.0, 0.0
        self._skips.clear()
        for b in self._buckets.values():
            b.count[1] = min(b.count[1], n - 1)
            b.interval, b.since_probe, b.probing = 0, 0, False
            # the next drafting step counts as stale: weight 0.5, or, with history_probe, all (``_observe``)
            b.last[1] = -(self.cfg.probe_every + 1)
            b.log_ratio = None  # ... and the ratio restarts from the two means once it is in

    def observe(
        self,
        bsz: int,
        drafted: bool,
        tokens: float,
        seconds: float,
        prefill: int = 0,
        wall_s: float | None = None,
        critical: int | None = None,
        extra_s: float | None = None,
    ) -> None:
        """Record one finished decode step: did it draft, tokens emitted, ``seconds`` of decoding (wall time less
        the modelled cost of its ``prefill`` merged prefill tokens) and its whole ``wall_s`` (default ``seconds``).
        ``extra_s``: for a drafting step, what it should cost beyond a plain step (``rate_seconds``; None: no cap).
        The explore budget compares wall times: the plain fit's, with its own prefill cost, or, when less, the
        bucket's measured plain rate plus the step's modelled prefill share (``wall_s - seconds``). ``critical``:
        for a drafting step of a batch that nothing waits to join, its ``critical_progress``; its tokens then count
        as ``credit`` says.
        """
        self._steps += 1
        if seconds <= 0.0 or bsz < 1:
            return
        wall = seconds if wall_s is None else wall_s
        if not drafted:  # folded in before anything reads the state: a plain step costs next to nothing here
            self._queue.append((bsz, tokens, seconds, prefill, wall))
            if wall > self._wall_hi:  # more room than the countdown assumed: check at the next step
                self._skips.clear()
            if len(self._queue) >= PLAIN_QUEUE_MAX:
                self._flush()
            return
        self._flush()
        self._skips.clear()  # the room changed: decide again
        rated = self.rate_seconds(bsz, seconds, extra_s)
        self._observe(bsz, True, self.credit(bsz, tokens, critical), seconds, prefill, wall, rated)

    def rate_seconds(self, bsz: int, seconds: float, extra_s: float | None) -> float:
        """The decode seconds a drafting step of ``bsz`` requests counts in the rates: ``seconds``, at most ``1 +
        wall_cap`` times the plain fit's step plus ``extra_s`` (``GovernorConfig.wall_cap``; as measured without
        ``extra_s`` or before the fit is ready).

        Example: a plain fit of 46 ms at batch 4, ``extra_s`` 16 ms and ``wall_cap`` 0.1 cap an 86-ms step at 68.2 ms.
        """
        self._flush()
        if extra_s is None or not self._plain.ready or math.isinf(self.cfg.wall_cap):
            return seconds
        return min(seconds, (1.0 + self.cfg.wall_cap) * (self._plain.base_cost(bsz) + max(extra_s, 0.0)))

    def credit(self, bsz: int, tokens: float, critical: int | None) -> float:
        """The plain steps' tokens worth what a drafting step's ``tokens`` for ``bsz`` requests saved: all of them
        while requests wait to join the batch (``critical`` None: a slot freed early is filled), else its rows and
        the steps its ``critical`` progress took off the batch's end, by the plain fit ``a + b * bsz``:
        ``bsz * (a * critical + b * tokens) / (a + b * bsz)``, at most ``tokens``. A token of a request that does not
        bound the end saves only its row in a later step, not a step's share.

        Example: with ``a = 60 ms``, ``b = 3 ms``, 17 tokens for 16 requests and ``critical = 1`` count as 16.44.
        """
        if critical is None or not self._plain.ready:
            return tokens
        a, per = self._plain.intercept(), self._plain.base_cost(bsz)
        b = (per - a) / bsz
        return min(tokens, bsz * (a * critical + b * tokens) / per)

    def _flush(self) -> None:
        """Fold the queued plain steps in, in order."""
        if self._queue:
            queue, self._queue = self._queue, []
            self._fold_plain(queue)
            self._walls.extend(q[4] for q in queue)
            self._wall_hi = max(self._walls)  # the recent steps: a longer one ends the next countdown

    def _fold_plain(self, queue: list[tuple[int, int, float, int, float]]) -> None:
        """``_observe`` of each queued plain step ``(bsz, tokens, seconds, prefill, wall)``, in order: the same
        updates, inlined (a plain step must cost the governor about nothing; tests/engine/test_governor.py checks
        the two agree)."""
        self._plain.observe_plain([(q[0], q[3], q[4]) for q in queue])
        every, decay = self.cfg.probe_every, self.cfg.decay
        for bsz, tokens, seconds, _, wall in queue:
            self._decode_s += wall
            b = self._bucket_of(bsz)
            rate = tokens / seconds
            if b.log_ratio is not None and b.spec_wins() and b.rate[1] > 0.0 and rate > 0.0:  # the loser, now
                b.log_ratio = 0.5 * b.log_ratio + 0.5 * math.log(b.rate[1] / rate)
            b.steps += 1
            keep = 0.0 if b.count[0] == 0 else 0.5 if b.steps - b.last[0] > every else decay
            b.rate[0] = keep * b.rate[0] + (1.0 - keep) * rate
            b.count[0] += 1
            b.last[0] = b.steps

    def _observe(self, bsz: int, drafted: bool, tokens: int, seconds: float, prefill: int, wall: float,
                 rated: float | None = None) -> None:  # fmt: skip
        """``observe`` of one step, now; ``rated``: its decode seconds in the rates (default ``seconds``)."""
        self._decode_s += wall
        b = self._bucket_of(bsz)
        if not drafted:
            self._plain.observe(bsz, bsz, wall, prefill=prefill)
        elif self._plain.ready:  # what the step would have cost plainly: tokens / bsz plain steps and the prefill
            step = self._plain.base_cost(bsz)
            measured = bsz / b.rate[0] if b.count[0] > 0 and b.rate[0] > 0.0 else None  # a plain step here, s
            plain = tokens * step / bsz + self._plain.prefill_cost() * prefill
            if measured is not None:  # or the bucket's measured plain rate, if less: the safe side
                plain = min(plain, tokens / b.rate[0] + (wall - seconds))
            excess = wall - plain
            self._excess += excess
            if not b.won:  # what a probe costs here: the room the next one waits for (and other buckets', in steps)
                if measured is not None:  # a plain step here as measured, when longer than the fit
                    step = max(step, measured)
                if rated is not None:  # a spike beyond ``wall_cap`` predicts nothing of the next probe's cost
                    excess -= seconds - rated
                cost = min(max(excess, 0.0), PROBE_ROOM_MAX * step)
                b.probe_excess = cost if b.probe_excess is None else 0.5 * (b.probe_excess + cost)
                self._probe_excess = cost / max(step, 1e-9)
        mode = int(bool(drafted))
        rate = tokens / (seconds if rated is None else rated)
        if b.log_ratio is not None and bool(drafted) != b.spec_wins() and b.rate[1 - mode] > 0.0 and rate > 0.0:
            r = math.log(rate / b.rate[0]) if mode else math.log(b.rate[1] / rate)  # the loser against the winner now
            b.log_ratio = 0.5 * b.log_ratio + 0.5 * r
        elif b.log_ratio is not None and drafted and b.rate[0] > 0.0 and rate > 0.0:  # trusted drafting, re-checked
            w = self.cfg.trusted_weight
            ratio = (1.0 - w) * b.log_ratio + w * math.log(rate / b.rate[0])
            # a withdrawn trust is not buried: the next winning probe restores it
            b.log_ratio = ratio if ratio >= 0.0 else -TRUST_MARGIN
        b.steps += 1
        stale = b.steps - b.last[mode] > self.cfg.probe_every  # a probe after a long gap: weigh it as much as the past
        fresh = drafted and self.cfg.history_probe and b.last[1] < 0  # a new history's first: it replaces the mean
        keep = 0.0 if b.count[mode] == 0 or fresh else 0.5 if stale else self.cfg.decay
        b.rate[mode] = keep * b.rate[mode] + (1.0 - keep) * rate
        b.count[mode] += 1
        b.last[mode] = b.steps
        if drafted:
            b.probing = False

    def _bucket_of(self, bsz: int) -> _Bucket:
        """The bucket of ``bsz``, created when new (without building a spare one each call: this runs every step)."""
        key = _bucket(bsz)
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket()
        return b

    def plain_rate(self, bsz: int) -> float | None:
        """Measured tokens/s of plain steps in the bucket of ``bsz`` (None before the first)."""
        self._flush()
        b = self._buckets.get(_bucket(bsz))
        return b.rate[0] if b is not None and b.count[0] > 0 else None

    def rates(self) -> dict[int, tuple[float, float]]:
        """``{bucket: (plain tokens/s, drafting tokens/s)}`` as measured so far."""
        self._flush()
        return {k: (b.rate[0], b.rate[1]) for k, b in sorted(self._buckets.items())}
