"""What the HTTP layer asks of a rollout backend (torch engine or SGLang), as plain data; no torch import.

The routes convert every /generate body once into the engine's requests (``engine.types.GenerateRequest``, by
``server/schemas.py``), then call a ``HistoryBackend`` (the history routes; both backends are one) or a full
``Backend`` (the other routes of ``server/app.py``: the torch engine). A backend never sees raw JSON and never
validates shapes; it may still fail (``BackendError``) on a state problem. Example::

    req = GenerateRequest(rid="r0", input_ids=[1, 5, 7], prompt_id="p0", sampling=SamplingParams(max_new_tokens=4))
    [out] = await backend.generate([req])
    out.output_ids            # e.g. [9, 9, 2]
    out.finish_reason         # {"type": "stop", "matched": 2}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sglang_histospec.engine.types import GenerateRequest


class BackendError(RuntimeError):
    """A request that was well formed but could not be served (bad checkpoint path, server shutting down...).

    ``status`` is the HTTP status the route answers with.
    """

    def __init__(self, message: str, status: int = 400, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.field = status, field


class BackendUnavailable(BackendError):
    """The backend is shutting down or its engine failed (HTTP 503)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503)


class HistoryNotDurable(BackendError):
    """The history directory cannot be written: the change was not acknowledged (HTTP 507, names the cause)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=507)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """Facts the routes need to validate requests."""

    vocab_size: int
    """Token ids must lie in [0, vocab_size)."""
    context_len: int
    """Prompt tokens + max_new_tokens must not exceed this."""
    has_tokenizer: bool = True
    """False: ``text`` prompts are refused (send ``input_ids``)."""


@dataclass(slots=True)
class GenerationOutput:
    """One finished request, in the pieces SGLang's /generate response is built from."""

    rid: str
    output_ids: list[int]
    text: str
    prompt_tokens: int
    finish_reason: dict[str, Any]
    """SGLang shape: ``{"type": "stop", "matched": id}``, ``{"type": "length", "length": n}``,
    ``{"type": "abort", "message": str}``."""
    output_token_logprobs: list[float] | None = None
    """[completion_tokens] logprob of each emitted token, or None when not requested."""
    spec_verify_ct: int = 0
    """Target-model forward passes (verify steps) this request took part in."""
    spec_draft_token_num: int = 0
    """Draft tokens proposed for this request."""
    spec_accept_token_num: int = 0
    """Draft tokens accepted for this request (bonus tokens excluded)."""
    e2e_latency: float = 0.0
    weight_version: str = "default"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One prompt's responses pushed by a trainer."""

    prompt_id: str
    responses: list[list[int]]  # [n_responses][len] token ids
    rewards: list[float] | None = None  # [n_responses]
    prompt_tokens: list[int] | None = None  # [prompt_len] optional; its tail goes before each response

    def as_record(self) -> dict[str, Any]:
        """The entry as JSON (the history log's and the SGLang workers' format)."""
        return {
            "prompt_id": self.prompt_id,
            "responses": self.responses,
            "rewards": self.rewards,
            "prompt_tokens": self.prompt_tokens,
        }


@runtime_checkable
class HistoryBackend(Protocol):
    """What the history routes (``/histospec/history``, ``/histospec/end_step``, ``/histospec/stats``) use. All
    coroutine methods run on the server's event loop and must not block it (a backend hands work to its own
    thread or process)."""

    def limits(self) -> ModelLimits: ...

    async def push_history(self, step: int, entries: list[HistoryEntry]) -> tuple[int, int]:
        """Add the entries between engine steps, durably when the backend keeps a history directory (raises
        ``HistoryNotDurable`` if it cannot); returns (responses stored, of which replaced a prompt+step the history
        already held)."""
        ...

    async def end_step(self, step: int | None) -> None:
        """Close the drafter's open step (server-recorded responses become history)."""
        ...

    async def stats(self) -> dict[str, Any]:
        """JSON stats: ``history`` (the drafter's stats: prompts, history_tokens, memory_bytes...), optional
        ``gauges`` ({prometheus name: value}) for /metrics, and the rest of the backend's own figures.
        ``/histospec/stats`` shows the ``backend`` entry as the backend's, or the whole dict when there is none."""
        ...


@runtime_checkable
class Backend(HistoryBackend, Protocol):
    """The one interface the routes of ``server/app.py`` use: the history routes' plus generation, weights,
    caches and health."""

    def model_info(self) -> dict[str, Any]:
        """SGLang's /get_model_info keys at least: model_path, tokenizer_path, is_generation, weight_version."""
        ...

    def is_ready(self) -> bool: ...

    def health_problem(self) -> str | None:
        """None while the backend serves normally, else why not (``/health`` answers 503 with it), e.g. an
        engine failure or a history directory that can no longer be written."""
        ...

    def tokenize(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerationOutput]: ...

    async def abort(self, rids: list[str]) -> None:
        """Abort these requests if they still run; their ``generate`` call returns them with finish type abort."""
        ...

    async def abort_all(self) -> None:
        """Abort every queued or running request."""
        ...

    async def update_weights_from_disk(
        self, model_path: str, flush_cache: bool, weight_version: str | None, abort_all_requests: bool
    ) -> str:
        """Reload weights once running requests are done (or aborted); never touches the history.
        Returns a message; raises BackendError on failure."""
        ...

    async def flush_cache(self) -> str:
        """Drop cached KV (none survives a request in the torch engine); never touches the history."""
        ...

    async def shutdown(self) -> None: ...
