"""Subprocess of the kill -9 tests: push history durably in a loop, print ``ack <i>`` after each acknowledged
push, compact into a snapshot every few pushes. Usage: ``python -m tests.helpers.durable_pusher DIR SEED``."""

from __future__ import annotations

import random
import sys

from sglang_histospec.drafting.drafter import DrafterConfig
from sglang_histospec.drafting.history_log import DurableHistory


def main(directory: str, seed: int) -> None:
    rng = random.Random(seed)
    store = DurableHistory(directory, DrafterConfig(window=4))
    drafter = store.restore()
    start = int(drafter.stats()["open_step"])
    for i in range(start, start + 100_000):
        responses = [[rng.randrange(4, 60) for _ in range(rng.randrange(1, 400))] for _ in range(3)]
        drafter.add(f"p{i}", i, responses)
        store.append({"op": "push", "step": i, "entries": [{"prompt_id": f"p{i}", "responses": responses}]})
        drafter.end_step(i)
        store.append({"op": "end_step", "step": i})
        print(f"ack {i}", flush=True)
        if rng.random() < 0.2:
            store.snapshot(drafter)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
