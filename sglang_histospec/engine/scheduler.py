"""The request queue and the running batch: admit queued requests into free slots, retire finished ones.

Running request ``b`` owns KV-cache slot ``b``; a retired request's slot is filled by the last running request (its
cached K/V moved along). No torch: the cache is anything with ``move_slot(src, dst, length)``. Example::

    s = Scheduler(max_running=2, seed=0, eos_ids=frozenset({2}))
    for rid in "abc":
        s.add(GenerateRequest(rid=rid, input_ids=[1, 5]))
    [st.req.rid for st in s.admit()]   # ["a", "b"]: "c" waits for a free slot
    s.running[0].finish = {"type": "length", "length": 1}
    [st.req.rid for st in s.retire(cache)]   # ["a"]; "b" moved to slot 0 (cache.move_slot(1, 0, kv_len))
"""

from __future__ import annotations

import collections

import numpy as np

from sglang_histospec.engine.request import RequestState
from sglang_histospec.engine.types import ADMISSIONS, GenerateRequest


class Scheduler:
    """Admission of up to ``max_running`` requests; ``rids`` holds the ids of every queued or running one.

    ``admission="fifo"``: in arrival order. ``"groups"``: the waiting request whose prompt (``prompt_id``) has the
    fewest running samples first, in arrival order among equals. A group of G samples of one prompt then starts
    with one sample beside the other groups' first ones, and its later samples start once a sibling finished: with
    a finished response of their own prompt in the history, which drafts even in an RL run's first step (Seer runs
    one request of each group first for the same reason). Requests without a prompt id are groups of one.

    A request without its own sampling seed draws from ``default_rng([seed, n])``, n counting arrivals, so that its
    tokens do not depend on the admission order."""

    def __init__(self, max_running: int, seed: int, eos_ids: frozenset[int], admission: str = "fifo") -> None:
        if admission not in ADMISSIONS:
            raise ValueError(f"admission={admission!r}; use one of {', '.join(ADMISSIONS)}")
        self.max_running = max_running
        self.seed = seed
        self.eos_ids = eos_ids
        self.admission = admission
        self.waiting: collections.deque[GenerateRequest] = collections.deque()
        self.running: list[RequestState] = []
        self.rids: set[str] = set()
        self._arrival: dict[str, int] = {}  # rid of a waiting request -> its arrival number (its default seed)
        self._counter = 0
        self._groups: collections.Counter[str] = collections.Counter()  # prompt id -> running requests

    def add(self, request: GenerateRequest) -> None:
        """Queue a validated request (the engine checks its rid is not in ``rids``)."""
        self.rids.add(request.rid)
        self.waiting.append(request)
        self._arrival[request.rid] = self._counter
        self._counter += 1

    def admit(self) -> list[RequestState]:
        """Move queued requests into free slots, in the ``admission`` order; returns the new running states."""
        out = []
        while self.waiting and len(self.running) < self.max_running:
            req = self._next()
            seed = req.sampling.seed
            rng = np.random.default_rng(seed if seed is not None else [self.seed, self._arrival.pop(req.rid)])
            if req.prompt_id is not None:
                self._groups[req.prompt_id] += 1
            stop = set(req.sampling.stop_token_ids)
            if not req.sampling.ignore_eos:
                stop |= self.eos_ids
            st = RequestState(req=req, rng=rng, tokens=list(req.input_ids), stop_ids=frozenset(stop))
            st.skip = req.sampling.seed_offset
            self.running.append(st)
            out.append(st)
        return out

    def _next(self) -> GenerateRequest:
        """Pop the next request to admit (``admission``); the queue is not empty."""
        head = self.waiting[0]
        if self.admission == "fifo" or not self._groups.get(head.prompt_id):  # nothing runs before the head
            return self.waiting.popleft()
        best, fewest = head, self._groups[head.prompt_id]
        for r in self.waiting:  # in arrival order: the first of the fewest running wins, and none beats 0
            n = self._groups.get(r.prompt_id, 0)  # (no prompt id: never counted, so 0)
            if n < fewest:
                best, fewest = r, n
                if not n:
                    break
        self.waiting.remove(best)
        return best

    def drop_waiting(self, rid: str) -> GenerateRequest | None:
        """Remove a queued request (and forget its rid); None when ``rid`` is not queued."""
        for r in self.waiting:
            if r.rid == rid:
                self.waiting.remove(r)
                self.rids.discard(rid)
                self._arrival.pop(rid, None)
                return r
        return None

    def find_running(self, rid: str) -> RequestState | None:
        """The running, not yet finished request ``rid``, or None."""
        return next((st for st in self.running if st.req.rid == rid and st.finish is None), None)

    def max_pending(self) -> int:
        """The most tokens any running request still has to prefill."""
        return max(st.pending for st in self.running)

    def retire(self, cache) -> list[RequestState]:
        """Remove the finished requests, last slot first, moving the last running request into each freed slot
        (``cache.move_slot``); returns them in the order removed (highest slot first) and forgets their rids."""
        out = []
        for i in range(len(self.running) - 1, -1, -1):
            st = self.running[i]
            if st.finish is None:
                continue
            last = len(self.running) - 1
            if i != last:
                moved = self.running[last]
                cache.move_slot(last, i, moved.kv_len)
                self.running[i] = moved
            self.running.pop()
            self.rids.discard(st.req.rid)
            pid = st.req.prompt_id
            if pid is not None:
                self._groups[pid] -= 1
                if not self._groups[pid]:
                    del self._groups[pid]
            out.append(st)
        return out
