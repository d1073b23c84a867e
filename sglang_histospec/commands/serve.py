"""``histospec serve``: the HTTP rollout server (SGLang-compatible API plus history routes).

Example: ``histospec serve --backend torch --model /tmp/tiny --port 30000 --history-dir /tmp/h``.
``--backend sglang`` hands the parsed arguments, plus any argument this command does not know (SGLang's own, e.g.
``--max-total-tokens 4096``), to ``sglang_histospec.server.sglang_backend.run(args)``: SGLang's HTTP server with the
HISTOSPEC plugin and the /histospec routes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

from sglang_histospec.commands._flags import add_admission_flag, add_draft_selection_flag

COMMAND = ("serve",)
HELP = "serve the HTTP rollout API (SGLang /generate, history push, stats, metrics, weight updates)"

SGLANG_SERVE_MODULE = "sglang_histospec.server.sglang_backend"
ALLOW_EXTRA_ARGS = True
"""Unknown arguments are SGLang's own with ``--backend sglang`` (e.g. ``--dtype float32 --max-total-tokens 4096``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("torch", "sglang"), default="torch", help="engine behind the API")
    parser.add_argument(
        "--model",
        "--model-path",
        dest="model",
        required=True,
        help="Hugging Face model directory, or a name from `histospec model prepare`",
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (beyond loopback needs an admin key)")
    parser.add_argument("--port", type=int, default=30000)
    from sglang_histospec.server.launch import add_common_arguments

    add_common_arguments(parser)
    parser.add_argument("--speculative-algorithm", choices=("HISTOSPEC", "NONE"), default="HISTOSPEC")
    parser.add_argument("--num-draft-tokens", type=int, default=16, help="max draft nodes per request and step")
    parser.add_argument(
        "--history-window", type=int, default=None, help="past steps kept per prompt (default: DrafterConfig.window)"
    )
    parser.add_argument(
        "--scorer", choices=("anchors", "counts"), default=None, help="drafter scorer (default: DrafterConfig.scorer)"
    )
    parser.add_argument(
        "--draft-threads",
        type=int,
        default=None,
        help="threads the native drafter spreads a batch's drafts over (DrafterConfig.draft_threads, default 1; "
        "the drafts do not depend on it)",
    )
    parser.add_argument(
        "--draft-mode",
        choices=("tree", "chain"),
        default="tree",
        help="token tree or one path (chain: the counts scorer)",
    )
    parser.add_argument(
        "--budget-policy",
        choices=("paper", "released", "fixed"),
        default=None,
        help="per-request draft budgets (default: a fixed --num-draft-tokens, sized per step by --draft-selection "
        "adaptive; with --draft-selection always: paper)",
    )
    add_draft_selection_flag(parser)
    parser.add_argument("--history-dir", default=None, help="snapshot history here; restored at start")
    parser.add_argument("--snapshot-debounce-s", type=float, default=2.0)
    parser.add_argument(
        "--no-end-step-on-weight-update",
        dest="end_step_on_weight_update",
        action="store_false",
        help="weight updates do not close the drafter's step (the trainer calls /histospec/end_step)",
    )
    parser.add_argument(
        "--no-freeze-gc",
        dest="freeze_gc",
        action="store_false",
        help="keep the startup objects in garbage collection (default: frozen once the engine is built)",
    )
    parser.add_argument("--max-running-requests", type=int, default=64)
    add_admission_flag(parser)
    parser.add_argument("--max-context-len", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shutdown-timeout-s", type=float, default=10.0, help="SIGTERM: abort running requests, close after this"
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.server.http_api import check_admin_key
    from sglang_histospec.server.launch import check_bind

    try:
        check_admin_key(args.admin_api_key)
        check_bind(args.host, args.admin_api_key)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    extra = list(getattr(args, "extra_args", None) or [])
    if args.backend == "sglang":
        if importlib.util.find_spec("sglang") is None:
            print(
                "error: --backend sglang needs SGLang 0.5.23 installed in this environment (GPU: "
                "pip install 'sglang-histospec[sglang]'; CPU test harness: make install-sglang); or use --backend torch",
                file=sys.stderr,
            )
            return 2
        args.sglang_args = extra  # SGLang's own arguments, passed through unchanged
        return int(importlib.import_module(SGLANG_SERVE_MODULE).run(args) or 0)
    if extra:
        print(f"error: unrecognized arguments for --backend torch: {' '.join(extra)}", file=sys.stderr)
        return 2
    return _run_torch(args)


def _drafter_config(args: argparse.Namespace):
    """The torch engine's DrafterConfig from the drafter flags (``drafter_fields_from_args``)."""
    from sglang_histospec.drafting import DrafterConfig
    from sglang_histospec.server.launch import drafter_fields_from_args

    return DrafterConfig(**drafter_fields_from_args(args))


def _run_torch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sglang_histospec.drafting import BudgetConfig
    from sglang_histospec.engine.types import DraftPolicyConfig, EngineConfig
    from sglang_histospec.models import resolve_model
    from sglang_histospec.server.app import AppConfig, create_app
    from sglang_histospec.server.launch import limits_from_args, run_app
    from sglang_histospec.server.torch_backend import TorchBackend, TorchBackendConfig

    try:
        engine_config = EngineConfig(
            model_path=resolve_model(args.model),
            device=args.device,
            dtype=args.dtype,
            max_running_requests=args.max_running_requests,
            admission=args.admission,
            max_context_len=args.max_context_len,
            speculative_algorithm=args.speculative_algorithm,
            num_draft_tokens=args.num_draft_tokens,
            seed=args.seed,
            drafter=_drafter_config(args),
            draft_selection=args.draft_selection,
            policy=DraftPolicyConfig(budget=BudgetConfig(policy=args.budget_policy) if args.budget_policy else None),
        )
        backend = TorchBackend(
            TorchBackendConfig(
                engine=engine_config,
                history_dir=args.history_dir,
                snapshot_debounce_s=args.snapshot_debounce_s,
                end_step_on_weight_update=args.end_step_on_weight_update,
                freeze_gc=args.freeze_gc,
            )
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        app_config = AppConfig(
            admin_api_key=args.admin_api_key, max_request_bytes=args.max_request_bytes, limits=limits_from_args(args)
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app = create_app(backend, app_config)
    run_app(
        app,
        args.host,
        args.port,
        admin_api_key=args.admin_api_key,
        log_level=args.log_level,
        on_signal=backend.begin_shutdown,
        shutdown_timeout_s=args.shutdown_timeout_s,
    )
    return 0
