"""``histospec bench pipe-servers``: HistoPipe measured on real rollout servers, beside the simulator's prediction.

Starts CPU rollout servers, fits the cost model to them (:func:`calibrate`), replays trace steps through the
router once per policy and compares the servers' own step makespans and idle time with the simulator's. Workload,
``--overlap`` and every figure: docs/results.md, "What the bench commands measure"; measured runs: its "HistoPipe"
section. Example::

    histospec bench pipe-servers --steps 8 --json     # the last stdout line holds every figure
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

COMMAND = ("bench", "pipe-servers")
HELP = "HistoPipe policies through the router on real rollout servers (measured) and in the simulator (predicted)"
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "docs" / "data" / "demo_grpo_trace.jsonl.gz"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.pipe.planner import POLICIES

    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="recorded trace whose prompts are replayed")
    parser.add_argument("--model", default=None, help="model directory; default: the quick demo model")
    parser.add_argument("--servers", type=int, default=2, help="rollout servers (W)")
    parser.add_argument("--steps", type=int, default=8, help="replay the trace's first N steps")
    parser.add_argument("--length-scale", type=float, default=4.0, help="response length = recorded x this")
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated policies",
    )
    parser.add_argument("--speculative-algorithm", choices=("NONE", "HISTOSPEC"), default="NONE")
    parser.add_argument("--no-migrate", dest="migrate", action="store_false", help="router without migration")
    parser.add_argument("--overlap", action="store_true", help="one-step overlap (deferral) in router and simulator")
    parser.add_argument(
        "--max-running", type=int, default=8, help="batch cap of each server (more requests queue, as when KV is full)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="replay the steps this many times (fresh routers)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")


def _workload(args: argparse.Namespace, context_len: int) -> list:
    """Trace steps as StepWork with forced lengths (recorded x scale, within the model's context)."""
    from sglang_histospec.pipe.planner import Group
    from sglang_histospec.pipe.simulator import StepWork
    from sglang_histospec.trace.format import load_steps

    out, prompts = [], []
    for st in load_steps(args.trace)[0][: args.steps]:
        by_pid: dict[str, list] = {}
        for rec in st.records:
            by_pid.setdefault(rec.prompt_id, []).append(rec)
        groups, lengths, ids = [], [], []
        for pid, recs in by_pid.items():
            recs.sort(key=lambda r: r.sample)
            cap = context_len - len(recs[0].prompt) - 1
            groups.append(Group(pid, len(recs), len(recs[0].prompt)))
            lengths.append([max(1, min(cap, round(len(r.response) * args.length_scale))) for r in recs])
            ids.append((pid, list(recs[0].prompt)))
        out.append(StepWork(st.step, groups, lengths))
        prompts.append(ids)
    return out, prompts


def calibrate(clients, prompt: list[int], max_running: int = 64, lengths=(32, 96), repeats: int = 2):  # noqa: ANN001, ANN201
    """Timing samples of the servers: ``(batch, context tokens, seconds per iteration)`` at batch sizes up to
    ``max_running`` (their batch cap), from the servers' timestamps, sent as the router sends a step (one
    /generate per request, every server at once: they share the machine's cores as in the run; median over
    requests, servers and ``repeats``), and seconds of prefill per token (a long prompt against a short one)."""
    from concurrent.futures import ThreadPoolExecutor
    from statistics import median

    def one(job: tuple) -> float:
        client, ids, n, seed = job
        meta = client.generate([ids], max_new_tokens=n, ignore_eos=True, seed=seed)[0]["meta_info"]
        return meta["server_answered"] - meta["server_received"]

    def batch(ids: list[int], b: int, n: int) -> float:
        jobs = [(c, ids, n, k) for c in clients for k in range(b)]
        return median(t for _ in range(repeats) for t in pool.map(one, jobs))

    batches = sorted({1, max(1, max_running // 8), max(1, max_running // 2), max_running})
    samples = []
    with ThreadPoolExecutor(len(clients) * max_running) as pool:
        for b in batches:
            for n in lengths:
                samples.append((b, b * (len(prompt) + n / 2), batch(prompt, b, n) / n))
        long_prompt = (prompt * 96)[:96]
        prefill = max(0.0, (batch(long_prompt, 1, 1) - batch(prompt, 1, 1)) / (len(long_prompt) - len(prompt)))
    return samples, prefill


def fit_cost(samples: list, prefill: float, max_running: int):  # noqa: ANN201
    """:class:`CostModel` fitted to :func:`calibrate`'s samples."""
    from sglang_histospec.pipe.worker_cost import CostModel

    return CostModel(CostModel.fit(samples, prefill_token_s=prefill, max_running=max_running, tau=1.0))


class _PolicyRun:
    """One policy's router over the servers; ``step`` replays a trace step and measures it."""

    def __init__(self, urls: list[str], policy: str, cost, migrate: bool, overlap: bool = False) -> None:  # noqa: ANN001
        from sglang_histospec.router.config import RouterConfig
        from sglang_histospec.router.router import Router

        config = RouterConfig(
            backends=urls,
            policy=policy,
            migrate_outliers=migrate,
            health_interval_s=5.0,
            overlap=overlap,
        )
        self.router = Router(config, cost)
        self.router.start()
        self.index = {b.url: i for i, b in enumerate(self.router.backends)}
        self.steps: list[dict] = []
        self.lengths: dict[tuple[int, int], int] = {}  # (step, index) -> forced length
        self.intervals: dict[int, list[tuple[float, float]]] = {}  # the whole run's, per worker
        self.answered: set[tuple[int, int]] = set()

    def _timeline(self, answers: list[dict]) -> dict[int, list[tuple[float, float]]]:
        """Check every answer's forced length; its requests' server intervals per worker (kept for the run)."""
        by_worker: dict[int, list[tuple[float, float]]] = {}
        for out in answers:
            hp = out["meta_info"]["histopipe"]
            key = (hp["step"], hp["index"])
            assert key not in self.answered and len(out["output_ids"]) == self.lengths[key], "answered twice or cut"
            self.answered.add(key)
            for url, a, b in hp["intervals"]:
                by_worker.setdefault(self.index[url], []).append((a, b))
                self.intervals.setdefault(self.index[url], []).append((a, b))
        return by_worker

    def step(self, sw, ids: list) -> None:  # noqa: ANN001
        from sglang_histospec.pipe.timeline import measure_step

        item_params = [
            {"max_new_tokens": n, "sampling_seed": sw.step * 100000 + gi * 100 + s}
            for gi, ns in enumerate(sw.lengths)
            for s, n in enumerate(ns)
        ]
        base = {"temperature": 1.0, "ignore_eos": True}
        self.lengths.update(((sw.step, i), p["max_new_tokens"]) for i, p in enumerate(item_params))
        if self.router.config.overlap:
            got = self.router.overlap_step(sw.step, ids, sw.groups[0].size, base, item_params=item_params)
            answers = [o for o in got.results if o is not None] + got.carried
        else:
            answers = self.router.run_step(sw.step, ids, sw.groups[0].size, base, item_params=item_params)
            for i, out in enumerate(answers):  # synchronous answers are untagged: tag them as an overlap router does
                out["meta_info"]["histopipe"].update(step=sw.step, index=i)
        t = measure_step(self._timeline(answers), len(self.index))
        self.steps.append({"step": sw.step, "makespan": t.makespan, "idle_s": t.idle_s})

    def close(self) -> dict:
        from sglang_histospec.pipe.timeline import measure_step

        W = len(self.index)
        drained = self.router.drain() if self.router.config.overlap else []
        if drained:
            self._timeline(drained)
        migrations = self.router.migrations + self.router.deferred
        self.router.close()
        if self.router.config.overlap:  # steps overlap: the whole run's makespan and idle
            t = measure_step(self.intervals, W)
            span, idle = t.makespan, t.idle_s
        else:
            span = sum(s["makespan"] for s in self.steps)
            idle = sum(s["idle_s"] for s in self.steps)
        assert self.answered == set(self.lengths), "a request was not answered"
        return {"makespan": span, "idle_fraction": idle / (W * span), "migrations": migrations,
                "per_step": self.steps}  # fmt: skip


def _simulate(policy: str, workers: int, cost, work, overlap: bool = False) -> dict:  # noqa: ANN001
    from sglang_histospec.pipe.lengths import LengthPredictorConfig
    from sglang_histospec.pipe.planner import PlannerConfig
    from sglang_histospec.pipe.simulator import PipeSimConfig, PipeSimulator

    # with overlap, the router's own rules: a step starts once the last one is complete, deferred requests run on
    config = PipeSimConfig(workers=workers, overlap=overlap, router_gate=overlap)
    r = PipeSimulator(config, PlannerConfig(policy=policy), cost, LengthPredictorConfig(2)).run(work)
    span = r.makespan if overlap else sum(s.makespan for s in r.per_step)
    return {"makespan": span, "idle_fraction": r.idle_fraction,
            "migrations": r.migrations, "per_step": [s.makespan for s in r.per_step]}  # fmt: skip


def _warm_steps(work: list) -> list[int]:
    """Indices of the steps whose prompts were all replayed before (the planner has their history)."""
    seen: set[str] = set()
    out = []
    for i, sw in enumerate(work):
        ids = {g.prompt_id for g in sw.groups}
        if ids <= seen:
            out.append(i)
        seen |= ids
    return out


def _summary(repeats: list[dict], sim: dict, warm: list[int]) -> dict:
    """Means over repeats: makespan (sum of step makespans), on warm steps, idle share; the simulator's ratio."""
    n = len(repeats)
    span = sum(r["makespan"] for r in repeats) / n
    warm_span = sum(r["per_step"][i]["makespan"] for r in repeats for i in warm) / n
    return {
        "makespan": span,
        "makespan_per_repeat": [r["makespan"] for r in repeats],
        "warm_makespan": warm_span,
        "idle_fraction": sum(r["idle_fraction"] for r in repeats) / n,
        "migrations": sum(r["migrations"] for r in repeats) / n,
        "sim_warm_makespan": sum(sim["per_step"][i] for i in warm),
        "sim_over_measured": sim["makespan"] / span,
    }


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.demo.server_process import RolloutServerProcess
    from sglang_histospec.pipe.planner import POLICIES

    policies = args.policies.split(",")
    if (
        any(p not in POLICIES for p in policies)
        or args.servers < 1
        or args.steps < 1
        or args.repeats < 1
        or args.length_scale <= 0
    ):
        print(
            f"error: --policies from {POLICIES}, --servers/--steps/--repeats >= 1, --length-scale > 0",
            file=sys.stderr,
        )
        return 2
    model = args.model or str(_demo_model())
    context_len = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings", 2048)
    work, prompts = _workload(args, context_len)
    servers: list = []
    runs: dict = {}
    try:
        for _ in range(args.servers):
            extra = ["--max-running-requests", str(args.max_running)]
            servers.append(RolloutServerProcess(model, args.speculative_algorithm, extra_args=extra))
        clients = [s.client for s in servers]
        before, prefill_before = calibrate(clients, prompts[0][0][1], args.max_running)
        cost = fit_cost(before, prefill_before, args.max_running)  # the routers plan with it
        out = {"benchmark": "pipe-servers", "trace": args.trace, "servers": args.servers, "steps": len(work),
               "overlap": args.overlap,
               "requests_per_step": sum(g.size for g in work[0].groups), "max_running": args.max_running,
               "length_scale": args.length_scale, "cost_model_before": asdict(cost.config),
               "calibration_before": before, "results": []}  # fmt: skip
        measured: dict[str, list[dict]] = {p: [] for p in policies}
        for _ in range(args.repeats):  # fresh routers (empty history) per repeat
            runs = {p: _PolicyRun([s.url for s in servers], p, cost, args.migrate, args.overlap) for p in policies}
            if args.overlap:  # one policy after another: deferred requests run on into the next step
                for p in policies:
                    for sw, ids in zip(work, prompts):
                        runs[p].step(sw, ids)
                    measured[p].append(runs.pop(p).close())
            for k, (sw, ids) in enumerate(zip(work, prompts) if runs else ()):  # policies interleaved (load drifts)
                for p in policies[k % len(policies) :] + policies[: k % len(policies)]:
                    runs[p].step(sw, ids)
            for p in list(runs):
                measured[p].append(runs.pop(p).close())
        # calibrated again after the run: the machine's load drifts; the simulator uses both (pooled)
        after, prefill_after = calibrate(clients, prompts[0][0][1], args.max_running)
        pooled = fit_cost(before + after, (prefill_before + prefill_after) / 2, args.max_running)
        out.update(calibration_after=after, cost_model=asdict(pooled.config))
        warm = _warm_steps(work)
        out["warm_steps"] = [work[i].step for i in warm]
        print(f"{'policy':>11} {'measured_s':>10} {'warm_s':>7} {'idle':>6} {'moved':>5} {'sim_s':>7} {'sim_warm':>8} "
              f"{'sim_idle':>8} {'sim/meas':>8}")  # fmt: skip
        for policy in policies:
            sim = _simulate(policy, args.servers, pooled, work, args.overlap)
            row = _summary(measured[policy], sim, warm)
            for name, samples, pre in (("before", before, prefill_before), ("after", after, prefill_after)):
                alone = _simulate(policy, args.servers, fit_cost(samples, pre, args.max_running), work, args.overlap)
                row[f"sim_over_measured_{name}"] = alone["makespan"] / row["makespan"]
            out["results"].append({"policy": policy, **row, "repeats": measured[policy], "simulated": sim})
            print(
                f"{policy:>11} {row['makespan']:>10.2f} {row['warm_makespan']:>7.2f} {row['idle_fraction']:>6.1%} "
                f"{row['migrations']:>5} {sim['makespan']:>7.2f} {row['sim_warm_makespan']:>8.2f} "
                f"{sim['idle_fraction']:>8.1%} {row['sim_over_measured']:>8.3f}"
            )
    finally:
        for r in runs.values():
            r.close()
        for s in servers:
            s.stop()
    if args.json:
        print(json.dumps(out))
    return 0


def _demo_model() -> Path:
    from sglang_histospec.models.demo_model import build_or_load_demo_model

    return build_or_load_demo_model(quick=True, progress=False)
