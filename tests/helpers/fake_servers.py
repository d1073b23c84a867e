"""Fake SGLang-shaped rollout servers for router tests: seeded tokens, stalls, aborts (no model)."""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn
from fastapi import FastAPI

from sglang_histospec.server.launch import free_port


def fake_token(seed: int, j: int) -> int:
    """Token j of a seeded fake request (what a deterministic sampler emits at draw j)."""
    return 3 + (seed * 31 + j * 7) % 50


class StallServer:
    """SGLang-shaped /generate, /abort_request and /health; one token per ``delay_s``. A request whose prompt_id
    starts with "stall" and that starts at draw 0 hangs after ``stall_after`` tokens until it is aborted or its
    prompt id is in ``released`` (then it goes on). Answers carry ``meta_info.weight_version``."""

    def __init__(self, delay_s: float = 0.004, stall_after: int = 3) -> None:
        self.delay_s, self.stall_after = delay_s, stall_after
        self.aborted: set[str] = set()
        self.released: set[str] = set()
        self.weight_version = "default"
        self.calls: list[str] = []
        self.active = self.peak = 0
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict:
            return {}

        @app.post("/abort_request")
        async def abort(body: dict) -> dict:
            self.aborted.add(body["rid"])
            return {"success": True}

        @app.post("/update_weights_from_disk")
        async def update_weights(body: dict) -> dict:  # no barrier: running requests go on
            self.weight_version = str(body.get("weight_version", self.weight_version))
            return {"success": True, "message": "updated", "num_paused_requests": 0}

        @app.post("/generate")
        async def generate(body: dict) -> list:
            return list(await asyncio.gather(*(self._one(body, k) for k in range(len(body["input_ids"])))))

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    async def _one(self, body: dict, k: int) -> dict:
        rid, sp = body["rid"][k], body["sampling_params"][k]
        self.calls.append(rid)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await self._emit(body, k, rid, sp)
        finally:
            self.active -= 1

    async def _emit(self, body: dict, k: int, rid: str, sp: dict) -> dict:
        custom = sp.get("custom_params") or {}
        offset, seed = int(custom.get("seed_offset") or 0), sp["sampling_seed"]
        pid = str(custom.get("prompt_id") or "")
        stalls = pid.startswith("stall") and offset == 0
        out: list[int] = []
        while len(out) < sp["max_new_tokens"] and rid not in self.aborted:
            if stalls and len(out) >= self.stall_after and pid not in self.released:
                await asyncio.sleep(0.01)
                continue
            await asyncio.sleep(self.delay_s)
            out.append(fake_token(seed, offset + len(out)))
        finish = {"type": "abort", "message": "aborted"} if rid in self.aborted else {"type": "length"}
        prompt = len(body["input_ids"][k])
        meta = {"finish_reason": finish, "completion_tokens": len(out), "prompt_tokens": prompt, "id": rid}
        meta["weight_version"] = self.weight_version
        return {"text": "", "output_ids": out, "meta_info": meta}

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
