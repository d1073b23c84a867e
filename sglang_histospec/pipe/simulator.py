"""Discrete-event simulation of a rollout run on W workers under a HistoPipe policy (``histospec pipe simulate``).

:class:`PipeSimulator` plans every step of a workload (groups with their realized response lengths) with a
:class:`Planner`, runs it on simulated continuous-batching workers, migrates or (with one-step overlap, one step
off-policy) defers outliers, and reports makespan, its lower bound, idle and tail shares (modes, outlier rules and
metrics: its class docstring; measured runs: docs/results.md, "HistoPipe"). Example: :class:`PipeSimulator`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from sglang_histospec.pipe.lengths import LengthEstimate, LengthPredictor, LengthPredictorConfig
from sglang_histospec.pipe.planner import (
    DEFER_STEP_FACTOR,
    Group,
    Planner,
    PlannerConfig,
    StepPlan,
    defer_threshold,
    in_tail,
    outlier_threshold,
    remaining_length,
)
from sglang_histospec.pipe.worker_cost import CostModel
from sglang_histospec.pipe.worker_sim import WorkerSim

CHECK_INTERVAL = 0.01
"""Outlier scans of a step's tail are at least this share of the step's elapsed time apart."""


@dataclass(frozen=True, slots=True)
class StepWork:
    """One step of a workload: its groups and the realized response lengths of their samples."""

    step: int
    groups: list[Group]
    lengths: list[list[int]]
    """[group][sample] realized response length (tokens)."""

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.lengths):
            raise ValueError(f"step {self.step}: {len(self.groups)} groups but {len(self.lengths)} length lists")
        for g, ns in zip(self.groups, self.lengths):
            if len(ns) != g.size or any(not isinstance(n, int) or n < 1 for n in ns):
                raise ValueError(f"step {self.step}, prompt {g.prompt_id!r}: need {g.size} lengths >= 1, got {ns}")

    def requests(self) -> list[tuple[int, int]]:
        """``(prompt_len, length)`` of every request."""
        return [(g.prompt_len, n) for g, ns in zip(self.groups, self.lengths) for n in ns]


@dataclass(slots=True)
class PipeSimConfig:
    workers: int = 8
    """Rollout workers (data-parallel engine instances)."""
    overlap: bool = False
    """One-step overlap (one step off-policy, opt-in); False = synchronous, on-policy."""
    outliers: bool = True
    """Act on outliers: migrate (synchronous) or defer (overlap)."""
    oracle: bool = False
    """Plan every step with its realized lengths (each group's mean) instead of history: a reference that
    separates prediction error from what placement alone can reach."""
    router_gate: bool = False
    """With overlap, model the router's overlap (:meth:`Router.overlap_step`) instead of the pipeline: step s
    starts only once step s-1 is complete (its requests answered or deferred), on every worker at once (the
    client's next step call comes when the step call returns); a deferred request keeps running on its worker
    without a pause, beside the worker's share of the next step (nothing migrates, nothing is stolen); and the
    deferral threshold uses ``DEFER_STEP_FACTOR["router"]``. False: the pipeline (:class:`PipeSimulator`)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.workers, int) and self.workers >= 1):
            raise ValueError(f"PipeSimConfig.workers={self.workers!r}: must be an int >= 1")


@dataclass(slots=True)
class StepStats:
    step: int
    requests: int
    start: float
    end: float
    makespan: float
    lower_bound: float
    tail_s: float
    migrations: int
    history_share: float = 0.0
    """Share of the step's groups whose prompt had history when the step was planned."""


@dataclass(slots=True)
class PipeSimResult:
    policy: str
    workers: int
    overlap: bool
    makespan: float
    lower_bound: float
    idle_fraction: float
    tail_share: float
    migrations: int
    per_step: list[StepStats] = field(default_factory=list)
    steady_idle_fraction: float | None = None
    """Idle share from the completion of the last step planned without full history to the start of the last
    step: without the cold start and the final drain (a long run's steady state); None when that is empty."""
    idle_floor: float = 0.0
    """Idle share this run's busy worker-time would leave at a makespan equal to ``lower_bound``: the idle no
    schedule doing the same work avoids (with overlap, set by :func:`gate_bound`)."""

    def warm_bound_gap(self) -> float | None:
        """Synchronous runs: makespan over the bound, minus 1, summed over steps where every prompt had history."""
        warm = [s for s in self.per_step if s.history_share >= 1.0]
        if self.overlap or not warm:
            return None
        return sum(s.makespan for s in warm) / sum(s.lower_bound for s in warm) - 1.0

    def to_json(self) -> dict:
        """The ``histospec pipe simulate --json`` object: the metrics (:class:`PipeSimulator`) plus details."""
        return {
            "policy": self.policy,
            "workers": self.workers,
            "overlap": self.overlap,
            "steps": len(self.per_step),
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "bound_gap": self.makespan / self.lower_bound - 1.0 if self.lower_bound > 0 else 0.0,
            "idle_fraction": self.idle_fraction,
            "steady_idle_fraction": self.steady_idle_fraction,
            "idle_floor": self.idle_floor,
            "tail_share": self.tail_share,
            "migrations": self.migrations,
            "warm_steps": sum(s.history_share >= 1.0 for s in self.per_step),
            "warm_bound_gap": self.warm_bound_gap(),
            "per_step": [asdict(s) for s in self.per_step],
        }


@dataclass(slots=True)
class _Req:
    step: int  # index of the step it counts for (changes when deferred)
    prompt_id: str
    prompt_len: int
    length: int
    estimate: LengthEstimate
    done: int = 0  # tokens emitted before its current submission
    moves: int = 0  # times it was migrated or deferred
    migrated: bool = False  # moved to an idle worker once already


class PipeSimulator:
    """Runs a workload (modes, outlier rules and metrics below). Example::

    sim = PipeSimulator(PipeSimConfig(workers=2), PlannerConfig(policy="lpt"))
    result = sim.run([StepWork(0, [Group("a", 2), Group("b", 2)], [[900, 800], [100, 120]])])
    result.idle_fraction  # ~0.4: the short group's worker waits for the long one

    Every step of a workload (groups of requests with their realized response lengths) is planned by a
    :class:`Planner` from the lengths known so far, dispatched to :class:`WorkerSim` workers, and run; finished
    responses update the length predictor at once.

    Synchronous mode (default): step s starts when step s-1 has finished on every worker (on-policy).
    One-step overlap (``overlap=True``, opt-in): a worker starts its share of step s as soon as it has finished its
    own share of step s-1, provided step s-2 is complete on every worker; step s then runs on weights one step
    older than in synchronous mode, so its data is **one step off-policy**. Training time is not modelled.

    Outliers: while at most ``tail_fraction`` of a step's requests are unfinished, a request that has emitted more
    than ``outlier_factor`` x its prompt's predicted mean (and its p90) is, in synchronous mode, migrated to an idle
    worker (aborted and resubmitted with prompt + partial output, which that worker prefills again; the partial
    tokens are kept), or, with overlap, deferred: taken off its worker and finished as part of the next step,
    which lets its step complete. A request is migrated at most once and deferred at most ``max_deferrals`` times;
    a straggler past ``DEFER_STEP_FACTOR["pipeline"]`` times its step's mean predicted length is deferred too.
    With overlap the pipeline also drains and steals: a deferred request continues on an idle worker when there
    is one (alone: no batch-mates slow it), else on the next step's worker with the fewest requests; in the last
    step (nothing to defer to) a straggler past the deferral threshold moves to an idle worker, as in synchronous
    mode; and a worker that has finished its share of a step and would wait takes part of the unstarted share of
    the same step from a worker still on an earlier step (late binding: the plan's backlog estimates miss
    stragglers). ``router_gate`` (:class:`PipeSimConfig`) models the router's overlap instead.

    Metrics: ``makespan`` (end of the last step), ``lower_bound`` (synchronous: the sum over steps of
    max(longest request alone, total work / W); overlap: the larger of max(longest request alone, total work of the
    run / W), see :meth:`CostModel.lower_bound`, and :func:`gate_bound`), ``idle_fraction`` (idle worker-time /
    (W x makespan); a worker is busy while it holds a running request), ``idle_floor`` (the idle share the run's
    busy time leaves at a makespan equal to the bound), ``tail_share`` (time from the moment 90 % of a step's
    requests have finished to the step's end, summed over steps, over the summed step makespans), ``migrations``
    (moved or deferred requests).
    """

    def __init__(
        self,
        config: PipeSimConfig | None = None,
        planner: PlannerConfig | None = None,
        cost: CostModel | None = None,
        lengths: LengthPredictorConfig | None = None,
    ) -> None:
        self.config = config or PipeSimConfig()
        self.cost = cost or CostModel()
        self.planner = Planner(self.cost, planner or PlannerConfig())
        self.lengths_config = lengths or LengthPredictorConfig()

    def run(
        self,
        steps: Sequence[StepWork],
        predictor: LengthPredictor | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> PipeSimResult:
        """Simulate ``steps`` in order; ``progress(n)`` is called with the number of steps that completed."""
        return _Run(self, list(steps), predictor or LengthPredictor(self.lengths_config), progress).go()


class _Run:
    """State of one simulation (one event loop)."""

    def __init__(
        self,
        sim: PipeSimulator,
        steps: list[StepWork],
        predictor: LengthPredictor,
        progress: Callable[[int], None] | None,
    ) -> None:
        W = sim.config.workers
        self.sim, self.steps, self.predictor, self.progress = sim, steps, predictor, progress
        self.cost, self.cfg, self.pcfg = sim.cost, sim.config, sim.planner.config
        self.lag = 2 if sim.config.overlap and not sim.config.router_gate else 1
        self.workers = [WorkerSim(self.cost) for _ in range(W)]
        self.version = [0] * W
        self.heap: list[tuple[float, int, int]] = []
        self.cur = [-1] * W  # step index each worker is on
        self.out = [0] * W  # unfinished requests of its current step on each worker
        self.guests: set[tuple] = set()  # requests migrated to a worker on a later step (not in its out count)
        self.todo: dict[tuple[int, int], list[tuple]] = {}  # (step index, worker) -> keys not yet submitted
        self.reqs: dict[tuple, _Req] = {}
        self.plans: dict[int, StepPlan] = {}
        self.step_mean: dict[int, float] = {}  # mean predicted length of each planned step
        n = len(steps)
        self.unfinished = [sum(g.size for g in s.groups) for s in steps]
        self.total = list(self.unfinished)
        self.finish_times: list[list[float]] = [[] for _ in steps]
        self.start, self.end = [math.inf] * n, [0.0] * n  # per step: first submission, last finish
        self.complete, self.moves, self.history = [False] * n, [0] * n, [0.0] * n
        self.carry: dict[int, list[tuple[tuple, int]]] = {}
        self.completed = 0
        self.check_at = math.inf  # time of the pending outlier scan
        self.in_tail = [False] * n  # steps whose tail has been scanned
        self.waiting = False  # an outlier waits for a free worker
        self.snap_end: list[tuple[float, float] | None] = [None] * n  # (time, busy) when each step completed
        self.steady_to: tuple[float, float] | None = None  # ... when the last step started

    # ---- driving -------------------------------------------------------------------------------------------
    def go(self) -> PipeSimResult:
        for w in range(len(self.workers)):
            self._try_start(w, 0.0)
        while self.heap:
            t, ver, w = heapq.heappop(self.heap)
            if w < 0:  # an outlier check
                self.check_at = math.inf
                self._outliers(t)
                continue
            if ver != self.version[w]:
                continue
            for key, ft in self.workers[w].advance(t):
                self._finished(key, ft, w)
            self._schedule(w)
            if self.out[w] == 0:
                self._try_start(w, t)
            if self.cfg.outliers and (
                self._tail_changed() or (self.waiting and any(worker.is_idle() for worker in self.workers))
            ):
                self._outliers(t)
        assert all(self.complete), "every step must complete"
        return self._result()

    def _schedule(self, w: int) -> None:
        self.version[w] += 1
        nf = self.workers[w].next_finish()
        if math.isfinite(nf):
            heapq.heappush(self.heap, (nf, self.version[w], w))

    def _gate_open(self, s: int) -> bool:
        return all(self.complete[: max(0, s - self.lag + 1)])

    def _try_start(self, w: int, t: float) -> None:
        """Move worker ``w`` on to its next step(s) while it has nothing left and the gate is open."""
        while self.out[w] == 0 and self.cur[w] + 1 < len(self.steps) and self._gate_open(self.cur[w] + 1):
            s = self.cur[w] + 1
            if s not in self.plans:
                self._plan(s, t)
            self.cur[w] = s
            keys = self.todo.pop((s, w), [])
            if keys:
                self._start_keys(w, s, keys, t)
            self.out[w] = len(keys)
            self._schedule(w)
        if self.cfg.overlap and not self.cfg.router_gate and self.out[w] == 0 and self.workers[w].is_idle():
            self._steal(w, t)

    def _steal(self, u: int, t: float) -> None:
        """Idle worker ``u`` takes part of the unstarted share of its step from the worker with the most unstarted
        requests there that is still on an earlier step (the pipeline with overlap: :class:`PipeSimulator`)."""
        s = self.cur[u]
        victims = [v for v in range(len(self.workers)) if v != u and self.cur[v] < s and self.todo.get((s, v))]
        if s < 0 or not victims:
            return
        v = max(victims, key=lambda v: (len(self.todo[(s, v)]), -v))
        take, self.todo[(s, v)] = self._balance(v, self.todo[(s, v)])
        if not take:
            return
        self._start_keys(u, s, take, t)
        self.out[u] += len(take)
        self._schedule(u)

    def _start_keys(self, w: int, s: int, keys: list[tuple], t: float) -> None:
        """Worker ``w`` starts ``keys`` of step ``s`` at ``t`` (the step starts then, if it had not)."""
        if s == len(self.steps) - 1 and self.steady_to is None:
            self.steady_to = (t, self._busy_at(t))
        self.start[s] = min(self.start[s], t)
        for key in keys:
            r = self.reqs[key]
            self.workers[w].submit(key, r.prompt_len + r.done, r.length - r.done, at=t)

    def _balance(self, v: int, keys: list[tuple]) -> tuple[list[tuple], list[tuple]]:
        """Split worker ``v``'s unstarted ``keys`` between an idle worker (first list) and ``v`` (second), longest
        predicted first, each to the side predicted to finish first (``v`` after draining its current work)."""
        worker = self.workers[v]
        base = [0.0, 0.0 if worker.is_idle() else worker.drain_time(self._remaining)]
        sides: list[list[tuple]] = [[], []]
        reqs: list[list[tuple[int, int]]] = [[], []]
        for key in sorted(keys, key=lambda k: -remaining_length(self.reqs[k].estimate, self.reqs[k].done)):
            r = self.reqs[key]
            req = (r.prompt_len + r.done, remaining_length(r.estimate, r.done))
            side = min((0, 1), key=lambda x: (base[x] + self.cost.batch_time(reqs[x] + [req]), x))
            sides[side].append(key)
            reqs[side].append(req)
        return sides[0], sides[1]

    def _plan(self, s: int, t: float) -> None:
        work = self.steps[s]
        backlog = [0.0] * len(self.workers)
        if self.cfg.overlap:
            for w, worker in enumerate(self.workers):
                if not worker.is_idle():
                    drain = worker.drain_time(self._remaining)
                    backlog[w] = max(0.0, worker.now + drain - t)
        predictor = self.predictor
        if self.cfg.oracle:
            predictor = LengthPredictor(LengthPredictorConfig(window=1))
            for g, ns in zip(work.groups, work.lengths):
                predictor.add(g.prompt_id, work.step, ns)
        plan = self.sim.planner.plan(
            work.step, work.groups, len(self.workers), predictor, backlog=backlog, overlap=self.cfg.overlap
        )
        self.plans[s] = plan
        self.step_mean[s] = plan.mean_predicted()
        self.history[s] = sum(predictor.predict(g.prompt_id).known for g in work.groups) / len(work.groups)
        for w, reqs in enumerate(plan.workers):
            keys = []
            for gi, si in reqs:
                g = work.groups[gi]
                key = (s, gi, si)
                self.reqs[key] = _Req(
                    s, g.prompt_id, g.prompt_len, work.lengths[gi][si], predictor.predict(g.prompt_id)
                )
                keys.append(key)
            self.todo[(s, w)] = keys
        for key, w in self.carry.pop(s, []):
            self.todo[(s, w)].insert(0, key)
            self.total[s] += 1
            self.unfinished[s] += 1

    def _remaining(self, key: tuple, generated: int) -> int:
        r = self.reqs[key]
        return remaining_length(r.estimate, r.done + generated)

    # ---- events --------------------------------------------------------------------------------------------
    def _finished(self, key: tuple, t: float, w: int) -> None:
        r = self.reqs[key]
        self._release(key, w)
        self.predictor.observe(r.prompt_id, self.steps[key[0]].step, r.length)
        s = r.step
        self.finish_times[s].append(t)
        self.unfinished[s] -= 1
        self.end[s] = max(self.end[s], t)
        if self.unfinished[s] == 0:
            self._step_complete(s, t)

    def _busy_at(self, t: float) -> float:
        """Worker-seconds of busy time of all workers up to ``t`` (workers advance lazily)."""
        return sum(w.busy_s + (max(0.0, t - w.now) if w.running else 0.0) for w in self.workers)

    def _step_complete(self, s: int, t: float) -> None:
        self.snap_end[s] = (t, self._busy_at(t))
        self.complete[s] = True
        self.completed += 1
        if self.progress is not None:
            self.progress(self.completed)
        for w in range(len(self.workers)):
            self._try_start(w, t)

    def _outliers(self, t: float) -> None:
        """Scan the running requests of steps in their tail; move or defer outliers; schedule the next scan.

        Scans run when a step enters its tail, at timer events (the earliest time a request crosses its
        threshold, but at most every ``CHECK_INTERVAL`` of the step's elapsed time) and, while an outlier waits
        for a free worker, whenever a worker goes idle.
        """
        self.waiting = False
        next_check = math.inf
        for _, w, key in self._tail_requests():
            worker, r = self.workers[w], self.reqs[key]
            action = self._action(r)
            if action is None or key not in worker.running:
                continue
            limit = self._threshold(r.step, r)
            if not r.done + worker.generated_at(key, t) > limit:
                when = worker.time_when(key, math.floor(limit) + 1 - r.done)
                later = max(when, t + CHECK_INTERVAL * (t - self.start[r.step]), math.nextafter(t, math.inf))
                next_check = min(next_check, later)  # strictly later: a finish due at t is handled first
                continue
            moved = self._defer(key, w, t) if action == "defer" else self._migrate(key, w, t)
            self.waiting = self.waiting or not moved
        if next_check < self.check_at:
            self.check_at = next_check
            heapq.heappush(self.heap, (next_check, 0, -1))

    def _tail_requests(self) -> list[tuple[int, int, tuple]]:
        """``(step, worker, key)`` of the running requests whose step is in its tail, by step then worker."""
        out = []
        for w, worker in enumerate(self.workers):
            for key in worker.running:
                s = self.reqs[key].step
                if (
                    self.complete[s]
                    or s not in self.plans
                    or not in_tail(self.unfinished[s], self.total[s], self.pcfg)
                ):
                    continue
                self.in_tail[s] = True
                out.append((s, w, key))
        out.sort(key=lambda x: (x[0], x[1]))  # stable: each worker's running order is kept
        return out

    def _action(self, r: _Req) -> str | None:
        """What an outlier ``r`` may still undergo: ``"defer"`` (overlap), ``"migrate"``, or None."""
        if not self.cfg.overlap:
            return "migrate" if r.moves < 1 else None
        if r.moves < self.pcfg.max_deferrals and r.step + 1 < len(self.steps):
            return "defer"
        last = r.step + 1 == len(self.steps)
        return "migrate" if last and not r.migrated and not self.cfg.router_gate else None

    def _threshold(self, s: int, r: _Req) -> float:
        """Tokens past which running request ``r`` of step ``s`` is acted on (see ``PlannerConfig``)."""
        if self.cfg.overlap:
            factor = DEFER_STEP_FACTOR["router" if self.cfg.router_gate else "pipeline"]
            return defer_threshold(r.estimate, self.pcfg, self.step_mean[s], factor)
        return outlier_threshold(r.estimate, self.pcfg)

    def _tail_changed(self) -> bool:
        """True when a step just entered its tail (its first scan is due)."""
        for s in set(self.cur):
            if s >= 0 and not self.in_tail[s] and in_tail(self.unfinished[s], self.total[s], self.pcfg):
                return True
        return False

    def _take(self, key: tuple, w: int, t: float) -> _Req | None:
        """Abort ``key`` on worker ``w`` at time ``t``, keeping its partial output (None if it finished first)."""
        worker = self.workers[w]
        for k, ft in worker.advance(t):  # bring the worker to t first
            self._finished(k, ft, w)
        if key not in worker.running:
            self._schedule(w)
            return None
        r = self.reqs[key]
        r.done += worker.remove(key)
        r.moves += 1
        self._release(key, w)
        self._schedule(w)
        return r

    def _release(self, key: tuple, w: int) -> None:
        """``key`` left worker ``w`` (finished or taken off): count it off ``w``'s current step."""
        if key in self.guests:
            self.guests.discard(key)
        else:
            self.out[w] -= 1

    def _hosts(self, s: int, w: int) -> list[int]:
        """Idle workers other than ``w`` that a request of step ``s`` may move to (synchronous: those on ``s``)."""
        return [
            v
            for v, other in enumerate(self.workers)
            if v != w and other.is_idle() and (self.cfg.overlap or self.cur[v] == s)
        ]

    def _migrate(self, key: tuple, w: int, t: float) -> bool:
        """Move outlier ``key`` from worker ``w`` to an idle worker; False when none is idle (try again later)."""
        s = self.reqs[key].step
        source = self.workers[w]
        if len(source.running) + len(source.queue) < 2 or key not in source.running:
            return True  # alone on its worker: moving it would only cost a prefill
        free = self._hosts(s, w)
        if not free:
            return False
        r = self._take(key, w, t)
        if r is None:
            return True
        r.migrated = True
        self._resume(key, free[0], t)
        self.moves[s] += 1
        if self.out[w] == 0:
            self._try_start(w, t)
        return True

    def _resume(self, key: tuple, v: int, t: float) -> None:
        """Run taken-off ``key`` on worker ``v`` from ``t``: counted on ``v``'s step, or a guest of a later one."""
        r = self.reqs[key]
        self.workers[v].submit(key, r.prompt_len + r.done, r.length - r.done, at=t)
        if self.cur[v] == r.step:
            self.out[v] += 1
        else:
            self.guests.add(key)
        self._schedule(v)

    def _defer(self, key: tuple, w: int, t: float) -> bool:
        """Take outlier ``key`` off worker ``w``; it finishes as part of the next step (on ``w``)."""
        s = self.reqs[key].step
        if s + 1 >= len(self.steps) or key not in self.workers[w].running:
            return True
        if self.cfg.router_gate:
            return self._relabel(key, w, t)
        r = self._take(key, w, t)
        if r is None:
            return True
        r.step = s + 1
        self.moves[s] += 1
        self.unfinished[s] -= 1
        ahead = [v for v in range(len(self.workers)) if self.cur[v] == s + 1]
        idle = self._hosts(s + 1, w)
        if idle:  # an idle worker takes it at once, alone
            self._resume(key, idle[0], t)
        elif ahead:  # a worker already on the next step takes it at once
            v = min(ahead, key=lambda v: (len(self.workers[v].running) + len(self.workers[v].queue), v))
            for k, ft in self.workers[v].advance(t):
                self._finished(k, ft, v)
            self._resume(key, v, t)
        elif s + 1 in self.plans:
            self.todo.setdefault((s + 1, w), []).insert(0, key)
        else:
            self.carry.setdefault(s + 1, []).append((key, w))
        if idle or ahead or s + 1 in self.plans:  # counted for s + 1 now (a carried one when s + 1 is planned)
            self.total[s + 1] += 1
            self.unfinished[s + 1] += 1
        self._deferred_from(s, w, t)
        return True

    def _relabel(self, key: tuple, w: int, t: float) -> bool:
        """Defer running ``key`` where it runs (``router_gate``): it counts for the next step and no
        longer holds worker ``w`` on its step."""
        r = self.reqs[key]
        s = r.step
        r.step, r.moves = s + 1, r.moves + 1
        self.moves[s] += 1
        self.unfinished[s] -= 1
        self.total[s + 1] += 1
        self.unfinished[s + 1] += 1
        self.start[s + 1] = min(self.start[s + 1], t)  # it runs for step s + 1 from now
        self._release(key, w)  # off w's count of step s ...
        self.guests.add(key)  # ... and not counted again when it finishes
        self._deferred_from(s, w, t)
        return True

    def _deferred_from(self, s: int, w: int, t: float) -> None:
        """A request of step ``s`` left worker ``w``'s count at ``t``: complete ``s`` if it was the last, and move
        ``w`` on if it has nothing left of its step."""
        if self.unfinished[s] == 0:
            self.end[s] = max(self.end[s], t)
            self._step_complete(s, t)
        if self.out[w] == 0:
            self._try_start(w, t)

    # ---- results -------------------------------------------------------------------------------------------
    def _steady_idle(self) -> float | None:
        """Idle share from the completion of the last cold step (planned without full history; else the first
        step) to the start of the last step; None when that window is empty."""
        cold = [s for s in range(len(self.steps)) if self.history[s] < 1.0] or [0]
        ends = [self.snap_end[s] for s in cold]
        if self.steady_to is None or any(e is None for e in ends):
            return None
        t0, b0 = max(ends)  # type: ignore[type-var]
        t1, b1 = self.steady_to
        if t1 <= t0:
            return None
        return max(0.0, 1.0 - (b1 - b0) / (len(self.workers) * (t1 - t0)))

    def _result(self) -> PipeSimResult:
        W = len(self.workers)
        per_step = []
        for s, work in enumerate(self.steps):
            times = sorted(self.finish_times[s])
            start = self.start[s] if self.cfg.overlap else (self.end[s - 1] if s else 0.0)
            makespan = self.end[s] - start
            t90 = times[max(0, math.ceil(0.9 * len(times)) - 1)] if times else self.end[s]
            per_step.append(
                StepStats(
                    step=work.step,
                    requests=len(times),
                    start=start,
                    end=self.end[s],
                    makespan=makespan,
                    lower_bound=self.cost.lower_bound(work.requests(), W),
                    tail_s=max(0.0, self.end[s] - t90),
                    migrations=self.moves[s],
                    history_share=self.history[s],
                )
            )
        total = max((s.end for s in per_step), default=0.0)
        if self.cfg.overlap:
            reqs = [r for work in self.steps for r in work.requests()]
            longest = [max(self.cost.solo_time(p, n) for p, n in work.requests()) for work in self.steps]
            deferrals = self.pcfg.max_deferrals if self.cfg.outliers else 0
            bound = max(self.cost.lower_bound(reqs, W) if reqs else 0.0, gate_bound(longest, deferrals))
        else:
            bound = sum(s.lower_bound for s in per_step)
        busy = sum(w.busy_s for w in self.workers)
        span = sum(s.makespan for s in per_step)
        return PipeSimResult(
            policy=self.pcfg.policy,
            workers=W,
            overlap=self.cfg.overlap,
            makespan=total,
            lower_bound=bound,
            idle_fraction=max(0.0, 1.0 - busy / (W * total)) if total > 0 else 0.0,
            steady_idle_fraction=self._steady_idle(),
            idle_floor=max(0.0, 1.0 - busy / (W * bound)) if bound > 0 else 0.0,
            tail_share=sum(s.tail_s for s in per_step) / span if span > 0 else 0.0,
            migrations=sum(self.moves),
            per_step=per_step,
        )


def gate_bound(longest: Sequence[float], deferrals: int = 1) -> float:
    """Makespan no schedule with one-step overlap beats, from its gate alone (``longest``: per step, the time its
    longest request takes alone on a worker, :meth:`CostModel.solo_time`; ``deferrals``: ``max_deferrals``).

    Step s starts no earlier than the completion of every step up to s - 2, and each of its requests finishes
    before the step it counts for completes: its own, or at most ``deferrals`` steps later (the last step defers
    nothing). So step min(s + deferrals, last) completes at least ``longest[s]`` after steps 0..s-2 did; the bound
    is the latest of these chained completions. Example: four steps of 10 s requests, one deferral each: 20.0
    (``gate_bound([10, 10, 10, 10], 1)``: step 3 waits for step 1, which waits for step 0's request).
    """
    if not (isinstance(deferrals, int) and deferrals >= 0):
        raise ValueError(f"deferrals={deferrals!r}: must be an int >= 0 (PlannerConfig.max_deferrals)")
    n = len(longest)
    done = [0.0] * n  # lower bound on each step's completion
    for s, d in enumerate(longest):
        if not (math.isfinite(d) and d >= 0):
            raise ValueError(f"longest[{s}]={d!r}: must be a finite time >= 0")
        gate = max(done[: max(0, s - 1)], default=0.0)
        last = min(s + deferrals, n - 1)
        done[last] = max(done[last], gate + d)
    return max(done, default=0.0)


def workload_from_trace(steps: Iterable, length_scale: float = 1.0) -> list[StepWork]:
    """Turn trace steps (``TraceStep``: ``.step`` and ``.records``, see ``trace/format.py``) into a workload.

    A group is a prompt id within a step (samples in ``sample`` order, groups in order of first appearance);
    the lengths are the prompts' and responses' token counts times ``length_scale`` (e.g. 8 to model
    responses eight times longer than those of a small synthetic trace), at least 1 for a response.
    """
    if not (math.isfinite(length_scale) and length_scale > 0):
        raise ValueError(f"length_scale={length_scale!r}: must be > 0")
    out = []
    for st in steps:
        samples: dict[str, list] = {}
        for rec in st.records:
            samples.setdefault(rec.prompt_id, []).append(rec)
        groups, lengths = [], []
        for pid, recs in samples.items():
            recs.sort(key=lambda r: r.sample)
            groups.append(Group(pid, len(recs), int(round(len(recs[0].prompt) * length_scale))))
            lengths.append([max(1, int(round(len(r.response) * length_scale))) for r in recs])
        if groups:
            out.append(StepWork(st.step, groups, lengths))
    return out
