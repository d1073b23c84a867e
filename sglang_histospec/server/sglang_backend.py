"""``histospec serve --backend sglang``: SGLang's own HTTP server with the HISTOSPEC algorithm and history routes.

The history routes (``server/history_routes.py``) are added to SGLang's FastAPI app over ``SGLangBackend``; a push
reaches every TP rank through SGLang's own RPC path (:class:`SchedulerBridge`) and is logged durably there when
``--histospec-history-dir`` is set (``plugin/durable.py``); our client limits guard SGLang's app
(``server/sglang_limits.py``); everything else is SGLang's (docs/sglang.md, docs/reliability.md). Example::

    python -m sglang_histospec.server.sglang_backend --model-path M --port 30000 --histospec-history-dir H
    curl -X POST localhost:30000/histospec/history -H 'Content-Type: application/json' \
      -d '{"step": 0, "entries": [{"prompt_id": "p", "responses": [[5]]}]}'
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from sglang_histospec.drafting.types import MAX_TOKEN_ID
from sglang_histospec.plugin import ALGORITHM_NAME
from sglang_histospec.server.protocol import BackendError, HistoryEntry, HistoryNotDurable, ModelLimits
from sglang_histospec.server.sglang_limits import (
    SGLangServeConfig,
    histospec_argv,
    install_guards,
    split_histospec_args,
)

logger = logging.getLogger(__name__)

RPC_TIMEOUT_S = 120.0
"""How long a route waits for the schedulers to apply a push (they apply it between two batches)."""


class SchedulerBridge:
    """Sends history operations to the HISTOSPEC workers of all scheduler processes and waits for their answer.

    A push travels through SGLang's own inter-process path: an ``RpcReqInput(method="draft_worker")`` sent on the
    tokenizer manager's channel to the schedulers, which call the HISTOSPEC worker inside their event loop on every TP
    rank at the same point, and answer through SGLang's RPC socket once all ranks passed the barrier. The route returns
    after that answer, so a push is visible to the next request. Everything else (``/generate``, weight updates,
    ``/flush_cache``, metrics) is SGLang's.
    """

    def __init__(self, stats_dir: str) -> None:
        self.stats_dir = Path(stats_dir)
        self._reply_socket = None
        self._lock = asyncio.Lock()

    def bind(self, rpc_ipc_name: str) -> None:
        """Bind the endpoint on which SGLang's scheduler (TP rank 0) answers RPC requests."""
        import zmq
        from sglang.srt.utils.network import get_zmq_socket

        self._reply_socket = get_zmq_socket(zmq.Context(1), zmq.DEALER, rpc_ipc_name, True)

    async def call(self, tokenizer_manager, op: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run ``op`` in every scheduler's HISTOSPEC worker and return TP rank 0's stats written right after it.

        Raises RuntimeError with SGLang's message when a worker failed, TimeoutError when no answer came.
        """
        import zmq
        from sglang.srt.managers.io_struct import RpcReqInput, RpcReqOutput, sock_recv, sock_send

        if self._reply_socket is None:
            raise RuntimeError("the SGLang schedulers are not started yet")
        request = RpcReqInput(
            method="draft_worker", parameters={"histospec_op": op, "payload": json.dumps(payload or {})}
        )
        async with self._lock:
            while self._reply_socket.poll(0, zmq.POLLIN):  # a late answer to an earlier, timed-out call
                sock_recv(self._reply_socket)
            sock_send(tokenizer_manager.send_to_scheduler, request)  # on the event loop thread, like SGLang's sends

            def wait() -> Any:
                if not self._reply_socket.poll(int(RPC_TIMEOUT_S * 1000), zmq.POLLIN):
                    raise TimeoutError(f"no answer from the SGLang schedulers within {RPC_TIMEOUT_S} s")
                return sock_recv(self._reply_socket)

            reply = await asyncio.to_thread(wait)
            if not isinstance(reply, RpcReqOutput):
                raise RuntimeError(f"unexpected answer from the SGLang scheduler: {type(reply).__name__}")
            if not reply.success:
                raise RuntimeError(reply.message)
            return self.read_stats()

    def read_stats(self) -> dict[str, Any]:
        path = self.stats_dir / "stats-tp0.json"
        return json.loads(path.read_text()) if path.exists() else {}


class SGLangBackend:
    """SGLang's server as a ``HistoryBackend`` (``server/protocol.py``): history operations go to the schedulers
    through the ``SchedulerBridge``; generation, weights and caches stay SGLang's own routes.

    ``/histospec/stats`` shows the drafter as seen by TP rank 0; ``/generate``, weight updates, ``/flush_cache`` and
    metrics are SGLang's own.
    """

    def __init__(self, bridge: SchedulerBridge) -> None:
        self.bridge = bridge

    def limits(self) -> ModelLimits:
        tm = _tokenizer_manager()
        vocab = int(getattr(tm.model_config, "vocab_size", MAX_TOKEN_ID - 1))
        return ModelLimits(vocab_size=vocab, context_len=int(tm.context_len))

    async def push_history(self, step: int, entries: list[HistoryEntry]) -> tuple[int, int]:
        payload = {"step": step, "entries": [e.as_record() for e in entries]}
        result = await self._call("push", payload, failure_status=400)
        return int(result.get("last_op_result", 0)), 0  # the workers do not tell replaced responses apart

    async def end_step(self, step: int | None) -> None:
        await self._call("end_step", {"step": step}, failure_status=400)

    async def stats(self) -> dict[str, Any]:
        history = await self._call("stats", None, failure_status=503)
        history = {k: v for k, v in history.items() if not k.startswith("last_op")}
        return {"history": history, "backend": {"name": "sglang", "algorithm": ALGORITHM_NAME}}

    async def _call(self, op: str, payload: dict[str, Any] | None, failure_status: int) -> dict[str, Any]:
        from sglang_histospec.drafting.history_log import NOT_SAVED

        try:
            return await self.bridge.call(_tokenizer_manager(), op, payload)
        except (RuntimeError, TimeoutError) as exc:
            if str(exc).startswith(NOT_SAVED):  # the workers applied it but could not log it: not acknowledged
                raise HistoryNotDurable(
                    f"{exc}; the change is not acknowledged, retry once the disk is fixed"
                ) from exc
            raise BackendError(str(exc), status=failure_status) from exc


def _tokenizer_manager() -> Any:
    from sglang.srt.entrypoints.http_server import get_global_state

    return get_global_state().tokenizer_manager


def model_facts() -> tuple[ModelLimits, bool] | None:
    """The served model's limits and whether SGLang enforces its context length (not with
    ``--allow-auto-truncate``); None until SGLang's tokenizer manager exists."""
    try:
        tm = _tokenizer_manager()
    except (ImportError, AttributeError):
        return None
    if tm is None or getattr(tm, "model_config", None) is None:
        return None
    vocab = int(getattr(tm.model_config, "vocab_size", MAX_TOKEN_ID - 1))
    truncate = bool(getattr(tm, "allow_auto_truncate", False))
    return ModelLimits(vocab_size=vocab, context_len=int(tm.context_len)), not truncate


def add_routes(app, bridge: SchedulerBridge, admin_api_key: str | None, config: SGLangServeConfig) -> None:
    """Add the history routes (``server/history_routes.py``) and our client limits (``server/sglang_limits.py``)
    to SGLang's FastAPI ``app``."""
    from sglang_histospec.server.history_routes import history_router
    from sglang_histospec.server.metrics import HistoryCounters

    router = history_router(
        SGLangBackend(bridge), HistoryCounters(), config.limits, foreign_host=True, admin_api_key=admin_api_key
    )
    app.include_router(router)
    install_guards(app, config, model_facts)


def _sglang_argv(args: argparse.Namespace) -> list[str]:
    """SGLang server arguments from ``histospec serve``'s parsed arguments (plus ``args.sglang_args``)."""
    argv = ["--model-path", args.model, "--host", args.host, "--port", str(args.port)]
    if args.speculative_algorithm != "NONE":
        argv += [
            "--speculative-algorithm",
            ALGORITHM_NAME,
            "--speculative-num-draft-tokens",
            str(args.num_draft_tokens),
        ]
    argv += ["--max-running-requests", str(args.max_running_requests), "--log-level", args.log_level]
    if getattr(args, "device", "auto") not in (None, "auto"):
        argv += ["--device", args.device]
    if getattr(args, "dtype", "auto") not in (None, "auto"):
        argv += ["--dtype", args.dtype]
    if getattr(args, "admin_api_key", None):
        argv += ["--admin-api-key", args.admin_api_key]
    argv += histospec_argv(_serve_config(args))
    return argv + list(getattr(args, "sglang_args", None) or [])


def _serve_config(args: argparse.Namespace) -> SGLangServeConfig:
    """``histospec serve``'s ``--history-dir``, ``--max-request-bytes`` and client limits (defaults when absent)."""
    import dataclasses

    from sglang_histospec.server.schemas import RequestLimits

    limits = {f.name: getattr(args, f.name, f.default) for f in dataclasses.fields(RequestLimits)}
    return SGLangServeConfig(
        history_dir=getattr(args, "history_dir", None),
        max_request_bytes=getattr(args, "max_request_bytes", 64 * 2**20),
        limits=RequestLimits(**limits),
    )


def drafter_env(args: argparse.Namespace, environ: MutableMapping[str, str]) -> None:
    """``histospec serve``'s drafter flags (``--history-window``, ``--scorer``, ``--draft-mode``,
    ``--draft-threads``) into ``$HISTOSPEC_DRAFTER_CONFIG`` (merged into the JSON fields already there), which the
    plugin reads in SGLang's scheduler processes; ValueError when the result is no valid ``DrafterConfig``."""
    from sglang_histospec.plugin.adapter import DRAFTER_CONFIG_ENV, drafter_config_from_env
    from sglang_histospec.server.launch import drafter_fields_from_args

    fields = drafter_fields_from_args(args)
    if not fields:
        return
    drafter_config_from_env(environ)  # ValueError: the variable is bad already
    merged = {**json.loads(environ.get(DRAFTER_CONFIG_ENV, "").strip() or "{}"), **fields}
    drafter_config_from_env({DRAFTER_CONFIG_ENV: json.dumps(merged)})  # ValueError: a bad flag value
    environ[DRAFTER_CONFIG_ENV] = json.dumps(merged)


def run(args: argparse.Namespace) -> int:
    """The hook of ``histospec serve --backend sglang`` (``sglang_histospec.commands.serve``)."""
    try:
        drafter_env(args, os.environ)  # inherited by the scheduler processes, which SGLang spawns later
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return main(_sglang_argv(args))


def main(argv: list[str] | None = None) -> int:
    """Start SGLang's HTTP server with ``argv`` (SGLang's own arguments; HISTOSPEC unless another algorithm)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # our arguments out; a history that cannot be restored refuses the start before SGLang loads anything
        config, argv = split_histospec_args(argv)
        _check_history_dir(config.history_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not any(a == "--speculative-algorithm" or a.startswith("--speculative-algorithm=") for a in argv):
        argv += ["--speculative-algorithm", ALGORITHM_NAME]
    from sglang.srt.plugins import load_plugins

    load_plugins()  # runs our entry point like every other SGLang process (registers HISTOSPEC)
    from sglang_histospec.plugin import register

    register()  # also when the entry point's metadata is missing (a source checkout on PYTHONPATH)
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()  # the hooks register() added after load_plugins applied them (none otherwise)

    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.engine import init_tokenizer_manager
    from sglang.srt.server_args import prepare_server_args

    from sglang_histospec.plugin.durable import HISTORY_DIR_ENV
    from sglang_histospec.plugin.worker import STATS_DIR_ENV

    server_args = prepare_server_args(argv)
    stats_dir = tempfile.mkdtemp(prefix="histospec-sglang-")
    os.environ[STATS_DIR_ENV] = stats_dir  # inherited by the scheduler processes (spawned after this)
    if config.history_dir is not None:
        os.environ[HISTORY_DIR_ENV] = os.path.abspath(config.history_dir)
    bridge = SchedulerBridge(stats_dir)
    add_routes(http_server.app, bridge, getattr(server_args, "admin_api_key", None), config)

    def init_tokenizer_manager_with_bridge(server_args, port_args, *rest, **kw):
        bridge.bind(port_args.rpc_ipc_name)
        return init_tokenizer_manager(server_args, port_args, *rest, **kw)

    server_args.resolve_once()
    try:
        http_server.launch_server(server_args, init_tokenizer_manager_func=init_tokenizer_manager_with_bridge)
    finally:
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(os.getpid(), include_parent=False)
    return 0


def _check_history_dir(directory: str | None) -> None:
    """ValueError when ``directory`` cannot be written, or holds a history a restore would refuse (the workers
    restore it in SGLang's scheduler processes, where a failure would not say so as plainly)."""
    if directory is None:
        return
    from sglang_histospec.drafting.history_log import DurableHistory
    from sglang_histospec.drafting.history_scan import refusal

    DurableHistory(directory).close()  # ValueError: not writable
    problem = refusal(directory)
    if problem is not None:
        raise ValueError(problem)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
