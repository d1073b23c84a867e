"""``HistoSpecWorker``: SGLang's NGRAM worker with its global n-gram corpus replaced by the per-prompt history.

Imported only inside SGLang processes (through :func:`sglang_histospec.plugin.register`); what it changes against
NGRAM: :class:`HistoSpecWorker`; docs/sglang.md, "How it works". Example (what SGLang does with it)::

    worker = HistoSpecWorker(server_args, gpu_id, nccl_port, target_worker)
    worker.forward_batch_generation(batch)          # drafts from history, verifies with the target model
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, ScheduleBatch
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from sglang_histospec.drafting.prompt_ids import prompt_id_for, token_prompt_id
from sglang_histospec.plugin.adapter import AdapterConfig, HistorySpecCorpus, drafter_config_from_env
from sglang_histospec.plugin.durable import WorkerHistory, WorkerHistoryConfig

logger = logging.getLogger(__name__)

STATS_DIR_ENV = "HISTOSPEC_SGLANG_STATS_DIR"
"""Set by ``histospec serve --backend sglang``: each TP rank writes ``stats-tp<rank>.json`` there on request."""


class HistoSpecWorker(NGRAMWorker):
    """SGLang's NGRAM worker drafting from the per-prompt history.

    Imported only inside SGLang processes (through the factory registered by :func:`sglang_histospec.plugin.register`).
    SGLang keeps driving verification, KV bookkeeping, the overlap relay and CUDA graphs exactly as for NGRAM; this
    class only changes where the N draft nodes of each request come from:

    * ``_prepare_draft_tokens``: one :class:`~sglang_histospec.plugin.adapter.HistorySpecCorpus` call for the batch
      (each request keyed by :func:`~sglang_histospec.drafting.prompt_ids.prompt_id_for`:
      ``custom_params["prompt_id"]``, or a hash of its prompt tokens);
    * ``note_request_finished``: the finished response becomes history for its prompt (aborts are dropped);
    * ``clear_cache_pool`` (every ``/flush_cache`` and, by default, every weight update): per-request state is dropped,
      the open step is closed, the history is KEPT (NGRAM would reset its corpus here);
    * ``__call__``: history pushes and stats requests that ``histospec serve --backend sglang`` sends through SGLang's
      own RPC path (``RpcReqInput(method="draft_worker")``), handled in the scheduler loop, so every TP rank applies
      them at the same point. Nothing here runs in a background thread.
    """

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self._tp_rank = int(getattr(self.model_runner, "tp_rank", 0) or 0)
        config = AdapterConfig(
            num_draft_tokens=get_spec().speculative_num_draft_tokens, drafter=drafter_config_from_env()
        )
        # $HISTOSPEC_HISTORY_DIR: restored here, every push and step end logged before it is answered
        self.history = WorkerHistory(WorkerHistoryConfig.from_env(), self._tp_rank, config.drafter)
        self.histospec = HistorySpecCorpus(config, drafter=self.history.restore())
        # SGLang's own calls on the corpus (synchronize, erase_match_state, reset) go to the adapter.
        self.ngram_corpus = _CorpusFacade(self.histospec)
        self._reqs: dict[str, Any] = {}  # rid -> Req, for the responses of finished requests
        self._prompt_ids: dict[str, str] = {}
        logger.info("HISTOSPEC drafter ready: %d draft nodes per request", self.draft_token_num)

    # ---- drafting --------------------------------------------------------------------------------------------
    def _prompt_id(self, req) -> str:
        pid = self._prompt_ids.get(req.rid)
        if pid is None:
            custom = getattr(req.sampling_params, "custom_params", None)
            try:
                pid = prompt_id_for(custom if isinstance(custom, dict) else None, req.origin_input_ids_unpadded)
            except ValueError as exc:  # never raise inside SGLang's scheduler loop: key the request by its tokens
                logger.warning("request %s: %s; keyed by its prompt tokens instead", req.rid, exc)
                pid = token_prompt_id(req.origin_input_ids_unpadded)
            self._prompt_ids[req.rid] = pid
        return pid

    def _observe(self, req, extra: list[int]) -> None:
        self.histospec.observe(
            req.rid, self._prompt_id(req), req.origin_input_ids_unpadded, list(req.output_ids) + extra
        )

    def _prepare_draft_tokens(self, batch: ScheduleBatch):
        bs = len(batch.reqs)
        stride = self.draft_token_num
        # In overlap mode the previous round's accepted tokens are not in req.output_ids yet.
        use_prev = self.enable_overlap and not batch.grammar_needs_sync()
        if use_prev:
            prev_tokens, prev_lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
            if not prev_tokens.is_cpu:
                prev_tokens, prev_lens = prev_tokens.cpu(), prev_lens.cpu()
            self.prev_token_ids, self.prev_accept_lens = prev_tokens.tolist(), prev_lens.tolist()
        else:
            self.prev_token_ids, self.prev_accept_lens = [], [0] * bs
        for i, req in enumerate(batch.reqs):
            extra = self.prev_token_ids[i * stride : i * stride + self.prev_accept_lens[i]] if use_prev else []
            self._observe(req, extra)
        tokens, mask = self.histospec.draft_batch([req.rid for req in batch.reqs])
        assert tokens.shape[0] == bs * stride, (tokens.shape, bs, stride)
        return tokens, mask

    def _update_ngram_corpus(self, batch: ScheduleBatch):
        """NGRAM inserts every context window into a global trie here; the history drafter has nothing to do."""

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish=None, pp_proxy_tensors=None):
        for req in batch.reqs:
            self._reqs[req.rid] = req
        return super().forward_batch_generation(batch, on_publish=on_publish, pp_proxy_tensors=pp_proxy_tensors)

    # ---- request and cache lifecycle ----------------------------------------------------------------------------
    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        req = self._reqs.pop(rid, None)
        if req is None:
            self._prompt_ids.pop(rid, None)
            return
        aborted = isinstance(req.finished_reason, FINISH_ABORT)
        if not aborted:
            self._observe(req, [])
        self.histospec.finish(
            rid, list(req.output_ids), aborted=aborted, truncated=isinstance(req.finished_reason, FINISH_LENGTH)
        )
        self._prompt_ids.pop(rid, None)

    def clear_cache_pool(self):
        """SGLang flushed its caches (``/flush_cache``, weight updates): keep the history, close the open step."""
        self.histospec.forget_requests()
        try:  # SGLang's flush must go on; a step end that is not durable shows in the stats (history_problem)
            self._end_step(None)
        except OSError:
            logger.exception("HISTOSPEC: the step end of a cache flush is not durable")
        self._reqs.clear()
        self._prompt_ids.clear()
        self._prev_decode_rids = set()
        self._write_stats()

    # NGRAM's external-corpus API does not apply: history arrives per prompt through POST /histospec/history.
    def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        raise ValueError("HISTOSPEC has no global external corpus; push per-prompt history to /histospec/history")

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        raise ValueError("HISTOSPEC has no global external corpus")

    def remove_external_corpus(self, corpus_id: str) -> None:
        raise ValueError("HISTOSPEC has no global external corpus")

    def list_external_corpora(self) -> dict[str, int]:
        return {}

    # ---- history pushes and stats via SGLang's RPC path ------------------------------------------------------------
    def __call__(self, histospec_op: str, payload: str = "") -> None:
        """Entry point of ``RpcReqInput(method="draft_worker", parameters={"histospec_op": ..., "payload": ...})``.

        Ops: ``push`` (payload ``{"step": int, "entries": [{"prompt_id", "responses", "rewards"}]}``),
        ``end_step`` (payload ``{"step": int | null}``), ``stats`` (refresh the stats file). The stats file then
        carries ``last_op`` and ``last_op_result`` (responses added by a push).
        """
        body = json.loads(payload) if payload else {}
        result = 0
        if histospec_op == "push":
            entries = [
                (e["prompt_id"], e["responses"], e.get("rewards"), e.get("prompt_tokens")) for e in body["entries"]
            ]
            result = self.histospec.push(int(body["step"]), entries)
            record = {"op": "push", "step": int(body["step"]), "entries": body["entries"]}
            self.history.log(record, self.histospec.drafter)  # before the answer: acknowledged = durable
            logger.info("HISTOSPEC history push: step %s, %d responses added", body["step"], result)
        elif histospec_op == "end_step":
            self._end_step(body.get("step"))
        elif histospec_op != "stats":
            raise ValueError(f"histospec_op={histospec_op!r}; use push, end_step or stats")
        self._write_stats(last_op=histospec_op, last_op_result=result)

    def _end_step(self, step: int | None) -> None:
        """Close the open step, log it, and compact (the snapshot also holds the responses recorded so far)."""
        closed = self.histospec.drafter.open_step if step is None else int(step)
        self.histospec.end_step(step)
        self.history.log({"op": "end_step", "step": closed}, self.histospec.drafter)
        self.history.compact(self.histospec.drafter)

    def _write_stats(self, **extra) -> None:
        out_dir = os.environ.get(STATS_DIR_ENV)
        if not out_dir:
            return
        path = Path(out_dir) / f"stats-tp{self._tp_rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.histospec.stats(), "history_problem": self.history.problem, **extra}))
        tmp.replace(path)


class _CorpusFacade:
    """What SGLang's NGRAM code calls on ``self.ngram_corpus``, answered by the history adapter."""

    def __init__(self, corpus: HistorySpecCorpus) -> None:
        self._corpus = corpus

    def synchronize(self) -> None:
        return None

    def erase_match_state(self, rids) -> None:
        # Requests that left the decode batch: finished ones were handled by note_request_finished; retracted ones
        # come back with the same rid and are re-synchronised by observe().
        return None

    def reset(self) -> None:
        self._corpus.forget_requests()

    def list_external_corpora(self) -> dict[str, int]:
        return {}
