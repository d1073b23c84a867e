"""Concurrent decoding of a trace's steps, with and without the running-sibling source: tau and rounds.

Each step's requests decode in rounds: every running request drafts (one ``draft_batch``), is verified against its
recorded response and extends with its accepted tokens plus the bonus token; finished ones become siblings and free
their slots; after the step, each prompt's group is pushed as history (``add`` + ``end_step``). Admission: "all"
(every request of the step starts together), or at most ``--max-running`` at once, taken in (prompt, sample) order
("fifo") or as the engine's ``EngineConfig.admission="groups"`` (fewest running samples of the prompt first).
Prints one JSON line per (trace, budget, sources, admission).

Example::

    python scripts/lockstep_running.py docs/data/smollm2-arith-light.jsonl.gz --budgets 8,16
    python scripts/lockstep_running.py docs/data/smollm2-units-light.jsonl.gz --admission groups,fifo --max-running 16
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.types import COUNTS_SOURCES, SOURCES, accepted_length
from sglang_histospec.trace.format import TraceStep, load_steps


def admit(waiting: list[str], running: list[str], prompt_of: dict[str, str], limit: int, admission: str):
    """Move requests from ``waiting`` to ``running`` while a slot is free; yields each admitted id."""
    while waiting and len(running) < limit:
        if admission == "groups":
            live = Counter(prompt_of[r] for r in running)
            pick = min(waiting, key=lambda r: live[prompt_of[r]])  # the first among equals
        else:
            pick = waiting[0]
        waiting.remove(pick)
        running.append(pick)
        yield pick


def decode_step(d: HistoSpecDrafter, st: TraceStep, budget: int, limit: int | None, admission: str) -> Counter:
    """Decode one step's responses concurrently; counts of tokens, verify steps, drafted, accepted and rounds."""
    recs = {f"{st.step}:{r.prompt_id}:{r.sample}": r for r in st.records if r.response}
    waiting = sorted(recs, key=lambda r: (recs[r].prompt_id, recs[r].sample))
    prompt_of = {r: recs[r].prompt_id for r in recs}
    pos, running, out = dict.fromkeys(recs, 0), [], Counter()
    while waiting or running:
        for rid in admit(waiting, running, prompt_of, limit or len(recs), admission):
            d.start(rid, recs[rid].prompt_id, recs[rid].prompt)
        t0 = time.perf_counter()
        drafts = d.draft_batch(running, [budget] * len(running))
        out["draft_ns"] += int(1e9 * (time.perf_counter() - t0))
        emitted = []
        for rid, dr in zip(running, drafts):
            resp, p = recs[rid].response, pos[rid]
            a = accepted_length(dr.token_ids, dr.parents, resp, p)
            k = min(a + 1, len(resp) - p)
            emitted.append(resp[p : p + k])
            pos[rid] = p + k
            out.update(tokens=k, verify_steps=1, drafted=len(dr), accepted=min(a, k))
        out["rounds"] += 1
        d.extend_batch(running, emitted)
        for rid in [r for r in running if pos[r] == len(recs[r].response)]:
            d.finish(rid, recs[rid].response)
        running = [r for r in running if pos[r] < len(recs[r].response)]
    return out


def push_step(d: HistoSpecDrafter, st: TraceStep) -> None:
    groups: dict[str, tuple[list[int], list, list]] = {}
    for r in st.records:
        prompt, responses, rewards = groups.setdefault(r.prompt_id, (r.prompt, [], []))
        responses.append(r.response)
        rewards.append(r.reward)
    for pid, (prompt, responses, rewards) in groups.items():
        d.add(pid, st.step, responses, None if None in rewards else rewards, prompt_tokens=prompt)
    d.end_step(st.step)


def run(steps: list[TraceStep], budget: int, sources: tuple[str, ...], admission: str, limit: int | None) -> dict:
    d = HistoSpecDrafter(DrafterConfig(sources=sources))
    total, t0 = Counter(), time.perf_counter()
    for st in steps:
        total += decode_step(d, st, budget, limit, admission)
        push_step(d, st)
    return {
        "budget": budget,
        "running": "running" in sources,
        "admission": admission,
        "max_running": limit,
        "tau": round(total["tokens"] / total["verify_steps"], 6),
        **{k: total[k] for k in ("tokens", "verify_steps", "rounds", "drafted", "accepted")},
        "draft_us_mean": round(total["draft_ns"] / 1e3 / total["verify_steps"], 2),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--budgets", default="8,16", help="comma-separated draft budgets")
    ap.add_argument("--admission", default="all", help="comma list of all, fifo, groups")
    ap.add_argument(
        "--max-running", type=int, default=None, help="slots for fifo and groups (default: one per prompt)"
    )
    args = ap.parse_args()
    for path in args.traces:
        steps, _ = load_steps(path)
        prompts = len({r.prompt_id for r in steps[0].records})
        for budget in map(int, args.budgets.split(",")):
            for sources in (COUNTS_SOURCES, SOURCES):
                for admission in args.admission.split(","):
                    limit = None if admission == "all" else args.max_running or prompts
                    row = run(steps, budget, sources, admission, limit)
                    print(json.dumps({"trace": path.rsplit("/", 1)[-1], **row}), flush=True)


if __name__ == "__main__":
    main()
