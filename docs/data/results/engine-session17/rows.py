"""Step time of a verify pass vs extra rows per request (SmolLM2 policy, CPU, 1 thread)."""

import statistics
import sys
import time

import torch

from sglang_histospec.engine import EngineConfig
from sglang_histospec.engine import profile as P
from sglang_histospec.engine.engine import Engine

torch.set_num_threads(1)
e = Engine(EngineConfig(model_path=sys.argv[1], speculative_algorithm="NONE", max_running_requests=16))
fwd, cache = e._fwd, e._cache
P.CONTEXT = 200
for batch in (1, 4, 16):
    row = []
    for extra in (0, 1, 2, 3, 4, 6, 8, 12, 16):
        ts = []
        for _r in range(6):
            t = time.perf_counter()
            P._verify_pass(fwd, cache, batch, extra)
            ts.append(time.perf_counter() - t)
        row.append((extra, round(1e3 * statistics.median(ts[1:]), 1)))
    print(batch, row, flush=True)
