"""The trainer's view of one or more rollout servers (or one router): checks, generation, history, weights, stats.

No torch and no TRL here: token ids in, token ids and logprobs out (placement: :class:`RolloutServers`). Example::

    servers = RolloutServers(["http://127.0.0.1:30000"], request_timeout=600)
    servers.check(tokenizer)                       # reachable, same vocabulary and tokenizer as the trainer
    outs = servers.generate([[1, 5, 7]], ["p0"], SamplingConfig(max_new_tokens=16), return_logprob=True)
    outs[0].completion_ids, outs[0].logprobs       # [T] ids and [T] logprobs of the sampled tokens
    servers.push_history(step=3, entries=[{"prompt_id": "p0", "responses": [[5, 9, 2]], "rewards": [1.0]}])
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from sglang_histospec.server.client import HistoSpecClient, ServerError

TOKENIZER_PROBES = ("Hello world! 12+34=46", "The quick brown fox, 0.5 * (a - b)?\n")
"""Texts both tokenizers must encode identically (when the server's tokenizer is readable from here)."""


class RolloutServerUnreachable(ConnectionError):
    """No rollout server answered at a configured URL."""


class TokenizerMismatch(ValueError):
    """The trainer's tokenizer or model vocabulary differs from the rollout server's."""


@dataclass(slots=True)
class SamplingConfig:
    """The sampling parameters sent with every /generate request (SGLang's names)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 = off (TRL's ``top_k=0`` / None map here)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens besides the server model's EOS ids (the trainer sends its tokenizer's EOS ids)."""


@dataclass(slots=True)
class Completion:
    """One generated completion with the server's per-token figures."""

    completion_ids: list[int]  # [T]
    logprobs: list[float] | None  # [T] logprob of each sampled token (processed distribution), or None
    finish_reason: dict[str, Any]
    verify_steps: int
    """Target-model forward passes the request took part in (== T without drafting)."""
    drafted: int
    accepted: int
    server: str


def _route(prompt_id: str | None, n: int, fallback: int) -> int:
    if n == 1:
        return 0
    if prompt_id is None:
        return fallback % n
    return int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "little") % n


class RolloutServers:
    """Clients of every URL in ``urls``; thread pool for concurrent calls. Use ``close()`` when done.

    No torch and no TRL here: token ids in, token ids and logprobs out. Requests are spread over the servers by prompt
    id (a stable hash), so the samples of one GRPO group land on the same server and see each other as siblings;
    history pushes and weight updates go to every server.
    """

    def __init__(self, urls: Sequence[str], request_timeout: float = 600.0, admin_api_key: str | None = None) -> None:
        if isinstance(urls, str):
            urls = [urls]
        urls = [u.strip() for u in urls if u and u.strip()]
        if not urls:
            raise ValueError("rollout_urls is empty; pass the URL of a `histospec serve` server or of the router")
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"rollout_urls {bad} must start with http:// or https://")
        if request_timeout <= 0:
            raise ValueError(f"request_timeout={request_timeout}; use a positive number of seconds")
        self.urls = [u.rstrip("/") for u in urls]
        self.clients = [HistoSpecClient(u, admin_api_key=admin_api_key, timeout=request_timeout) for u in self.urls]
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(self.urls)), thread_name_prefix="histospec-rollout")

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for c in self.clients:
            c.close()

    def _each(self, fn: Callable[[HistoSpecClient], Any]) -> list[Any]:
        """``fn(client)`` on every server concurrently; connection failures become RolloutServerUnreachable."""
        futures = [self._pool.submit(fn, c) for c in self.clients]
        out = []
        for url, fut in zip(self.urls, futures):
            try:
                out.append(fut.result())
            except httpx.TransportError as exc:
                raise RolloutServerUnreachable(self._unreachable(url, exc)) from exc
        return out

    @staticmethod
    def _unreachable(url: str, exc: Exception) -> str:
        return (
            f"rollout server {url} is unreachable ({type(exc).__name__}: {exc}); start it first, e.g. "
            "`histospec serve --backend torch --model MODEL_DIR --port 30000`, and check rollout_urls"
        )

    # ---- checks ------------------------------------------------------------------------------------------
    def wait_until_ready(self, timeout: float) -> None:
        for url, c in zip(self.urls, self.clients):
            try:
                c.wait_until_ready(timeout=timeout)
            except TimeoutError as exc:
                raise RolloutServerUnreachable(self._unreachable(url, exc)) from exc

    def model_infos(self) -> list[dict[str, Any]]:
        return self._each(lambda c: c.model_info())

    def check(self, tokenizer: Any, model_vocab_size: int | None = None, ready_timeout: float = 30.0) -> None:
        """Raise RolloutServerUnreachable or TokenizerMismatch (naming the server and the difference)."""
        self.wait_until_ready(ready_timeout)
        for url, info in zip(self.urls, self.model_infos()):
            check_tokenizer(url, info, tokenizer, model_vocab_size)

    # ---- generation --------------------------------------------------------------------------------------
    def generate(
        self,
        input_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[str | None],
        sampling: SamplingConfig,
        return_logprob: bool = True,
        fallback_route: int = 0,
    ) -> list[Completion]:
        """One /generate per server (the prompts routed to it), concurrently; completions in prompt order."""
        if len(prompt_ids) != len(input_ids):
            raise ValueError(f"{len(prompt_ids)} prompt ids for {len(input_ids)} prompts")
        groups: dict[int, list[int]] = {}
        for i, pid in enumerate(prompt_ids):
            groups.setdefault(_route(pid, len(self.urls), fallback_route), []).append(i)

        def call(server: int, idx: list[int]) -> list[dict[str, Any]]:
            return self.clients[server].generate(
                [input_ids[i] for i in idx],
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                stop_token_ids=sampling.stop_token_ids,
                prompt_ids=[prompt_ids[i] for i in idx],
                return_logprob=return_logprob,
            )

        futures = {s: self._pool.submit(call, s, idx) for s, idx in groups.items()}
        result: list[Completion | None] = [None] * len(input_ids)
        for s, fut in futures.items():
            try:
                items = fut.result()
            except httpx.TransportError as exc:
                raise RolloutServerUnreachable(self._unreachable(self.urls[s], exc)) from exc
            for i, item in zip(groups[s], items):
                result[i] = _completion(item, self.urls[s], return_logprob)
        assert all(r is not None for r in result)
        return result  # type: ignore[return-value]

    # ---- history, weights, stats -------------------------------------------------------------------------
    def push_history(self, step: int, entries: Sequence[dict[str, Any]]) -> int:
        """Push to every server; returns the responses accepted by the first one."""
        if not entries:
            return 0
        return self._each(lambda c: c.push_history(step, entries))[0]

    def update_weights_from_disk(self, path: str, weight_version: str) -> None:
        for url, res in zip(self.urls, self._each(lambda c: _update(c, path, weight_version))):
            if not res.get("success", False):
                raise ServerError(400, f"{url} refused the weight update from {path}: {res.get('message')}")

    def post(self, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST ``body`` to ``route`` on every server (admin routes of the SGLang API); JSON answers."""
        return self._each(lambda c: c._request("POST", route, body).json())

    def post_one(self, index: int, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``route`` on server ``index``; its JSON answer."""
        return self.clients[index]._request("POST", route, body).json()

    def get_one(self, index: int, route: str) -> dict[str, Any]:
        return self.clients[index]._request("GET", route).json()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the servers' thread pool; returns its Future."""
        return self._pool.submit(fn, *args)

    def stats(self) -> list[dict[str, Any]]:
        return self._each(lambda c: c.stats())


def _update(client: HistoSpecClient, path: str, version: str) -> dict[str, Any]:
    return client.update_weights_from_disk(path, weight_version=version)


def _completion(item: dict[str, Any], url: str, return_logprob: bool) -> Completion:
    meta = item.get("meta_info", {})
    ids = [int(t) for t in item["output_ids"]]
    logprobs = None
    if return_logprob:
        entries = meta.get("output_token_logprobs")
        if entries is None or len(entries) != len(ids):
            raise ServerError(500, f"{url} returned no per-token logprobs for a return_logprob request")
        logprobs = [float("nan") if e[0] is None else float(e[0]) for e in entries]
    return Completion(
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=meta.get("finish_reason") or {},
        verify_steps=int(meta.get("spec_verify_ct") or len(ids)),
        drafted=int(meta.get("spec_draft_token_num") or 0),
        accepted=int(meta.get("spec_accept_token_num") or 0),
        server=url,
    )


def check_tokenizer(url: str, info: dict[str, Any], tokenizer: Any, model_vocab_size: int | None) -> None:
    """Compare the trainer's tokenizer (and model vocabulary) with what the server reports in /get_model_info.

    Checks: every token id of the tokenizer fits the server's vocabulary; the trainer model's vocabulary equals the
    server's (weights are copied one to one); and, when the server's ``tokenizer_path`` is readable from here, both
    tokenizers encode ``TOKENIZER_PROBES`` identically and share EOS/PAD ids.
    """
    server_vocab = info.get("vocab_size")
    if isinstance(server_vocab, int):
        if model_vocab_size is not None and model_vocab_size != server_vocab:
            raise TokenizerMismatch(
                f"the trainer's model has vocab_size {model_vocab_size} but the server at {url} serves "
                f"{info.get('model_path')!r} with vocab_size {server_vocab}; start the server with the same model"
            )
        if len(tokenizer) > server_vocab:
            raise TokenizerMismatch(
                f"the trainer's tokenizer has {len(tokenizer)} tokens but the server at {url} has a vocabulary of "
                f"{server_vocab}; use the tokenizer of the served model ({info.get('tokenizer_path')!r})"
            )
    path = info.get("tokenizer_path")
    if not path or not os.path.isdir(path):
        return
    from transformers import AutoTokenizer

    try:
        theirs = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return  # unreadable here (another machine's path): the vocabulary checks above are all we can do
    for probe in TOKENIZER_PROBES:
        mine, other = list(tokenizer(probe).input_ids), list(theirs(probe).input_ids)
        if mine != other:
            raise TokenizerMismatch(
                f"the trainer's tokenizer and the server's ({path}, at {url}) encode {probe!r} differently: "
                f"{mine[:12]} vs {other[:12]}; pass processing_class=AutoTokenizer.from_pretrained({path!r})"
            )
    for name in ("eos_token_id", "pad_token_id"):
        a, b = getattr(tokenizer, name, None), getattr(theirs, name, None)
        if a is not None and b is not None and a != b:
            raise TokenizerMismatch(f"{name} differs: trainer {a}, server {url} ({path}) {b}")
