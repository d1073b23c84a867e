"""The embedded torch engine: continuous batching with lossless HistoSpec tree verification.

Threading contract (for the server): an ``Engine`` is NOT thread-safe. Drive it from ONE thread: that thread calls
``add_request`` / ``abort`` / ``step`` / ``update_weights_from_disk`` / ``flush_cache`` / ``stats`` and the drafter
methods (``engine.drafter.add(...)``, ``engine.drafter.end_step(...)``); other threads hand work to it through a queue.

Life of a request: ``add_request`` queues it; each ``step()`` admits queued requests (prefill, up to
``max_running_requests``), then runs ONE verify forward for every running request (its draft tree, or just its
last token with ``speculative_algorithm="NONE"``) and returns the requests that finished in this step (including
aborted ones). ``generate`` is the blocking convenience loop over ``add_request`` + ``step``.

Example::

    engine = Engine(EngineConfig(model_path="/tmp/tiny", device="cpu"))
    engine.add_request(GenerateRequest(rid="a", input_ids=[1, 2, 3], prompt_id="p0"))
    done = []
    while engine.has_unfinished():
        done += engine.step()
    done[0].output_ids      # the generated tokens
"""

from __future__ import annotations

from sglang_histospec.engine.types import EngineConfig, GenerateRequest, GenerateResult


class Engine:
    """Batched generation for one Hugging Face causal LM (Llama, Qwen2, Qwen3) with HistoSpec drafting.

    Attributes: ``config`` (EngineConfig), ``drafter`` (core HistoSpecDrafter; history survives weight updates and
    cache flushes), ``tokenizer`` (the model directory's tokenizer, or None when it has none), ``vocab_size``,
    ``max_context_len``, ``eos_token_ids``, ``device`` (str), ``model_path`` (the current weights' directory),
    ``weight_version`` (str | None).
    """

    def __init__(self, config: EngineConfig) -> None:
        raise NotImplementedError("in progress (helper engine)")

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request. Raises ValueError for a duplicate rid, a token id >= vocab_size, or a prompt with
        ``len(input_ids) + max_new_tokens > max_context_len`` (the message names the field)."""
        raise NotImplementedError

    def step(self) -> list[GenerateResult]:
        """Admit queued requests and run one verify step; return the requests that finished in it."""
        raise NotImplementedError

    def has_unfinished(self) -> bool:
        """True while requests are queued or running (or aborted ones not yet returned by ``step``)."""
        raise NotImplementedError

    def abort(self, rid: str) -> bool:
        """Abort a queued or running request; its result (finish type "abort", tokens so far) comes out of the
        next ``step()``. Returns False when the rid is unknown (already finished). Aborted responses are never
        recorded into the history."""
        raise NotImplementedError

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Run the requests to completion (with any already queued); results in the order of ``requests``."""
        raise NotImplementedError

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Load new weights (same architecture and shapes) from a directory; running requests continue with the
        new weights after their KV cache is recomputed. Never touches the drafter's history. Raises ValueError
        when the directory is missing or the shapes differ (the old weights stay)."""
        raise NotImplementedError

    def flush_cache(self) -> bool:
        """Drop cached KV state; only when idle (returns False when requests are running). Never drops history."""
        raise NotImplementedError

    def stats(self) -> dict:
        """Counters: requests_total, requests_running, requests_waiting, prompt_tokens, generated_tokens,
        verify_steps, draft_tokens, accepted_tokens, tau (generated / verify steps over decode steps), drafter
        stats under "drafter", speculative_algorithm, weight_version."""
        raise NotImplementedError
