"""The embedded torch engine as a ``Backend`` of the HTTP server: one engine, driven by one ``EngineLoop`` thread.

Durable history (``history_dir``) and how recorded responses become history steps: :class:`TorchBackend`; README,
"HTTP server". Example::

    backend = TorchBackend(TorchBackendConfig(engine=EngineConfig(model_path="/tmp/tiny"), history_dir="/tmp/h"))
    app = create_app(backend)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from sglang_histospec.drafting.history_log import SNAPSHOT_NAME, DurableHistory, HistoryWriteError
from sglang_histospec.engine.types import EngineConfig, GenerateRequest, GenerateResult
from sglang_histospec.server.engine_loop import EngineLoop
from sglang_histospec.server.protocol import (
    BackendError,
    GenerationOutput,
    HistoryEntry,
    HistoryNotDurable,
    ModelLimits,
)

logger = logging.getLogger(__name__)

__all__ = ["SNAPSHOT_NAME", "TorchBackend", "TorchBackendConfig"]


@dataclass(slots=True)
class TorchBackendConfig:
    """The engine's config plus what the server adds around it."""

    engine: EngineConfig
    history_dir: str | None = None
    """Directory of the history (log + snapshot): restored at start, every push / end_step logged before it is
    answered. None = history lives in memory only."""
    snapshot_debounce_s: float = 2.0
    """Seconds between the first change not in a snapshot and the snapshot that compacts the log."""
    end_step_on_weight_update: bool = True
    """A weight update closes the drafter's open step (see :class:`TorchBackend`)."""
    freeze_gc: bool = False
    """Freeze the objects alive once the engine is built (``engine/heap.py``), so that full garbage collections
    skip them; for a process of its own (``histospec serve`` sets it), not for one that builds many backends."""


def _parse_step(version: str | None) -> int | None:
    if version is None:
        return None
    try:
        step = int(version)
    except ValueError:
        return None
    return step if step >= 0 else None


class TorchBackend:
    """Implements ``sglang_histospec.server.protocol.Backend`` (hence ``HistoryBackend``) over
    ``sglang_histospec.engine.Engine``.

    Durability (``history_dir``): a push or end_step is answered only once its record is fsync'd to the history
    log (``drafting/history_log.py``); snapshots compact the log. A directory that cannot be written refuses the start
    (ValueError); one lost at run time makes pushes fail with 507 naming the cause and ``/health`` answer 503 until a
    write succeeds again. Responses the server records itself are saved by the next snapshot.

    History and steps: every finished response is recorded by the engine as a sibling of the drafter's open step,
    under its prompt id (a request without one gets the id derived from its tokens, ``drafting/prompt_ids.py``). A
    weight update closes that step (``drafter.end_step``) so the recorded responses become history, numbered with the
    weight version they were generated under when it is an integer (TRL sends the global step as ``weight_version``);
    a trainer that pushes the same responses with that step number is deduplicated by the drafter (a pushed
    prompt+step is never counted twice). ``end_step_on_weight_update=False`` leaves steps to the trainer
    (``POST /histospec/end_step``). Weight updates and cache flushes never drop the history.
    """

    def __init__(self, config: TorchBackendConfig) -> None:
        from sglang_histospec.engine.engine import Engine

        self.config = config
        self.history: DurableHistory | None = None
        drafter = None
        if config.history_dir is not None:
            self.history = DurableHistory(config.history_dir, config.engine.drafter)  # ValueError: not writable
            drafter = self.history.restore()
            logger.info("restored history from %s: %s", config.history_dir, drafter.stats())
        self.engine = Engine(config.engine, drafter=drafter)
        self._limits = ModelLimits(
            vocab_size=int(self.engine.vocab_size),
            context_len=int(self.engine.max_context_len),
            has_tokenizer=self.engine.tokenizer is not None,
        )
        self._weight_version = str(self.engine.weight_version or "default")
        self.loop = EngineLoop(self.engine, history=self.history, snapshot_debounce_s=config.snapshot_debounce_s)
        if config.freeze_gc:
            from sglang_histospec.engine.heap import freeze_startup_heap

            logger.info("froze %d startup objects out of garbage collection", freeze_startup_heap())
        self.loop.start()

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new work and abort what runs, so every waiting client is answered at once."""
        self.loop.begin_shutdown()

    def _log(self, record: dict[str, Any]) -> None:
        """On the engine thread, after applying a change: make it durable (HistoryWriteError if not)."""
        if self.history is not None:
            self.history.append(record)

    # ---- Backend protocol --------------------------------------------------------------------------------
    def limits(self) -> ModelLimits:
        return self._limits

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.engine.model_path,
            "tokenizer_path": self.config.engine.model_path if self._limits.has_tokenizer else None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self._weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "vocab_size": self._limits.vocab_size,
            "max_context_len": self._limits.context_len,
            "speculative_algorithm": self.config.engine.speculative_algorithm,
            "backend": "torch",
            "device": str(self.engine.device),
        }

    def is_ready(self) -> bool:
        return self.loop.is_alive()

    def health_problem(self) -> str | None:
        if self.loop.failed is not None:
            return self.loop.failed
        if not self.loop.is_alive():
            return "server is shutting down"
        return self.loop.degraded

    def tokenize(self, text: str) -> list[int]:
        return list(self.engine.tokenizer(text).input_ids)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        if self.engine.tokenizer is None:
            return ""
        return self.engine.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    async def generate(self, requests: list[GenerateRequest]) -> list[GenerationOutput]:
        start = time.perf_counter()
        futures = [asyncio.wrap_future(self.loop.submit_request(req)) for req in requests]
        done, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:  # abort the rest of the batch: nothing keeps running for a failed HTTP request
            still_running = [req.rid for req, f in zip(requests, futures) if f in pending]
            await self._call(lambda engine: [engine.abort(r) for r in still_running])
            if pending:
                await asyncio.wait(pending)
            exc = failed[0].exception()
            if isinstance(exc, ValueError):
                raise BackendError(str(exc)) from exc
            raise exc  # type: ignore[misc]
        latency = time.perf_counter() - start
        return [self._output(f.result(), req, latency) for f, req in zip(futures, requests)]

    def _output(self, res: GenerateResult, req: GenerateRequest, latency: float) -> GenerationOutput:
        return GenerationOutput(
            rid=res.rid,
            output_ids=list(res.output_ids),
            text=self.decode(list(res.output_ids), skip_special_tokens=req.sampling.skip_special_tokens),
            prompt_tokens=res.prompt_tokens or len(req.input_ids),
            finish_reason=res.finish_reason,
            output_token_logprobs=res.output_logprobs,
            spec_verify_ct=res.spec_verify_ct,
            spec_draft_token_num=res.spec_draft_tokens,
            spec_accept_token_num=res.spec_accepted_tokens,
            e2e_latency=latency,
            weight_version=self._weight_version,
        )

    async def abort(self, rids: list[str]) -> None:
        await self._call(lambda engine: [engine.abort(r) for r in rids])

    async def abort_all(self) -> None:
        await asyncio.wrap_future(self.loop.abort_all())

    async def push_history(self, step: int, entries: list[HistoryEntry]) -> tuple[int, int]:
        def apply(engine: Any) -> tuple[int, int]:
            stored = replaced = 0
            for e in entries:
                again = engine.drafter.has_visit(e.prompt_id, step)
                n = int(engine.drafter.add(e.prompt_id, step, e.responses, e.rewards, prompt_tokens=e.prompt_tokens))
                stored += n
                replaced += n if again else 0
            self._log({"op": "push", "step": step, "entries": [e.as_record() for e in entries]})
            return stored, replaced

        return await self._call(apply, changes_history=True)

    async def end_step(self, step: int | None) -> None:
        def apply(engine: Any) -> None:
            closed = engine.drafter.stats()["open_step"] if step is None else step
            engine.drafter.end_step(step)
            self._log({"op": "end_step", "step": int(closed)})

        await self._call(apply, changes_history=True)

    async def update_weights_from_disk(
        self, model_path: str, flush_cache: bool, weight_version: str | None, abort_all_requests: bool
    ) -> str:
        if not os.path.isdir(model_path):
            raise BackendError(f"model_path: {model_path!r} is not a directory", field="model_path")
        if abort_all_requests:
            await asyncio.wrap_future(self.loop.abort_all())

        def apply(engine: Any) -> str:  # on the engine thread, with no request in flight
            generated_under = _parse_step(self._weight_version)
            try:
                engine.update_weights_from_disk(model_path, weight_version)
            except ValueError:
                raise
            except Exception as exc:  # unreadable checkpoint (pickle, truncated file, other config): old weights stay
                raise BackendError(
                    f"model_path: cannot load weights from {model_path!r} ({type(exc).__name__}: {exc}); "
                    "the current weights stay",
                    field="model_path",
                ) from exc
            if weight_version is not None:
                self._weight_version = weight_version
            if flush_cache:
                engine.flush_cache()
            if self.config.end_step_on_weight_update:
                closed = engine.drafter.stats()["open_step"] if generated_under is None else generated_under
                engine.drafter.end_step(generated_under)
                try:  # the weights are in use now: a failed log write degrades health, not the update
                    self._log({"op": "end_step", "step": int(closed)})
                except HistoryWriteError:
                    logger.exception("weight update: the step end is not durable")
            return f"Succeeded to update model weights from {model_path}."

        return await self._call(apply, barrier=True, changes_history=self.config.end_step_on_weight_update)

    async def flush_cache(self) -> str:
        await self._call(lambda engine: engine.flush_cache(), barrier=True)
        return "Cache flushed."

    async def stats(self) -> dict[str, Any]:
        engine_stats = await self._call(lambda engine: engine.stats())
        drafter_stats = engine_stats.get("drafter") if isinstance(engine_stats, dict) else None
        return {
            "history": drafter_stats or {},
            "engine": {k: v for k, v in engine_stats.items() if k != "drafter"},
            "speculative_algorithm": self.config.engine.speculative_algorithm,
            "weight_version": self._weight_version,
            "snapshots_written": self.loop.snapshots_written,
            "gauges": {
                "histospec_requests_running": engine_stats.get("requests_running", 0),
                "histospec_requests_waiting": engine_stats.get("requests_waiting", 0),
            },
        }

    async def shutdown(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.loop.stop)

    async def _call(self, fn: Any, *, barrier: bool = False, changes_history: bool = False) -> Any:
        try:
            return await asyncio.wrap_future(self.loop.call(fn, barrier=barrier, changes_history=changes_history))
        except HistoryWriteError as exc:
            raise HistoryNotDurable(f"{exc}; the change is not acknowledged, retry once the disk is fixed") from exc
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
