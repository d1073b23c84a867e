"""A small synchronous client of the rollout server (either backend), used by the TRL trainer and the router.

Example (which ``step`` a push takes: :class:`HistoSpecClient`)::

    client = HistoSpecClient("http://127.0.0.1:30000", admin_api_key=None)
    client.wait_until_ready(timeout=60)
    outs = client.generate([[1, 5, 7]], max_new_tokens=16, temperature=1.0, prompt_ids=["p0"], return_logprob=True)
    outs[0]["output_ids"], outs[0]["meta_info"]["output_token_logprobs"]
    client.push_history(step=3, entries=[{"prompt_id": "p0", "responses": [[5, 9, 2]], "rewards": [1.0]}])
    client.update_weights_from_disk("/ckpt/step-4", weight_version="4")
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import httpx

DEFAULT_PUSH_BYTES = 8 * 2**20
"""History pushes are split into requests of about this many bytes of JSON (the server refuses > 64 MiB)."""


class ServerError(RuntimeError):
    """The server answered with an error status; ``status`` and the server's ``message``/``field``."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.field = status, message, field


class HistoSpecClient:
    """Thin httpx wrapper; one persistent connection pool. Safe to share between threads.

    History steps: push the responses of a generation with ``step`` = the ``weight_version`` the server had while it
    generated them (TRL: the global step of the weights sync before the generation). The server also records the
    responses itself and closes the step at the next weight update; with matching step numbers the drafter keeps
    the pushed copy only (never both).
    """

    def __init__(self, base_url: str, admin_api_key: str | None = None, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {admin_api_key}"} if admin_api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HistoSpecClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers -----------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, json_body: Any = None, content: bytes | None = None) -> httpx.Response:
        if content is not None:
            response = self._http.request(method, path, content=content, headers={"Content-Type": "application/json"})
        else:
            response = self._http.request(method, path, json=json_body)
        if response.status_code >= 400:
            message, field = response.text, None
            try:
                payload = response.json()
                err = payload.get("error") if isinstance(payload, dict) else None
                if isinstance(err, dict):
                    message, field = err.get("message", message), err.get("field")
                elif isinstance(payload, dict) and "message" in payload:
                    message = payload["message"]
            except ValueError:
                pass
            raise ServerError(response.status_code, message, field)
        return response

    # ---- API ---------------------------------------------------------------------------------------------
    def health(self) -> bool:
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.2) -> None:
        """Poll /health until it answers 200; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.base_url} not ready after {timeout} s")
            time.sleep(interval)

    def generate(
        self,
        input_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        stop_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        seed: int | None = None,
        prompt_ids: Sequence[str | None] | None = None,
        return_logprob: bool = False,
        rids: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """One batched /generate call; returns SGLang's response items (``text``, ``output_ids``, ``meta_info``)
        in prompt order. ``prompt_ids[i]`` is the history key of prompt i (None = the key derived from its tokens)."""
        n = len(input_ids)
        if prompt_ids is not None and len(prompt_ids) != n:
            raise ValueError(f"prompt_ids has {len(prompt_ids)} items for {n} prompts")
        base = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k}
        if stop_token_ids:
            base["stop_token_ids"] = list(stop_token_ids)
        if ignore_eos:
            base["ignore_eos"] = True
        if seed is not None:
            base["sampling_seed"] = seed
        params: list[dict[str, Any]] = []
        for i in range(n):
            sp = dict(base)
            if prompt_ids is not None and prompt_ids[i] is not None:
                sp["custom_params"] = {"prompt_id": prompt_ids[i]}
            params.append(sp)
        body: dict[str, Any] = {
            "input_ids": [list(p) for p in input_ids],
            "sampling_params": params,
            "return_logprob": return_logprob,
        }
        if rids is not None:
            body["rid"] = list(rids)
        return self._request("POST", "/generate", body).json()

    def push_history(self, step: int, entries: Sequence[dict[str, Any]], max_bytes: int = DEFAULT_PUSH_BYTES) -> int:
        """POST /histospec/history in chunks of about ``max_bytes``; returns the responses accepted in total.
        Each entry: ``{"prompt_id": str, "responses": [[int]], "rewards": [float] | None}``."""
        accepted = 0
        chunk: list[str] = []
        size = 0
        for entry in entries:
            text = json.dumps(entry, separators=(",", ":"))
            if chunk and size + len(text) > max_bytes:
                accepted += self._push_chunk(step, chunk)
                chunk, size = [], 0
            chunk.append(text)
            size += len(text) + 1
        if chunk:
            accepted += self._push_chunk(step, chunk)
        return accepted

    def _push_chunk(self, step: int, entries_json: list[str]) -> int:
        content = f'{{"step":{int(step)},"entries":[{",".join(entries_json)}]}}'.encode()
        return int(self._request("POST", "/histospec/history", content=content).json()["accepted"])

    def end_step(self, step: int | None = None) -> None:
        self._request("POST", "/histospec/end_step", {"step": step})

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/histospec/stats").json()

    def metrics(self) -> str:
        return self._request("GET", "/metrics").text

    def model_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_model_info").json()

    def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None = None, flush_cache: bool = True
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model_path": model_path, "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return self._request("POST", "/update_weights_from_disk", body).json()

    def flush_cache(self) -> None:
        self._request("POST", "/flush_cache")
