"""``histospec route``: the HistoPipe router in front of several rollout servers.

Example: ``histospec route --backends http://127.0.0.1:30001,http://127.0.0.1:30002 --policy histopipe --port 30000``.
Routes: ``POST /histopipe/step``, ``POST /generate``, history fan-out, health, stats, metrics (router/app.py).
"""

from __future__ import annotations

import argparse
import sys

COMMAND = ("route",)
HELP = (
    "HistoPipe router: plan steps across rollout servers, forward /generate, fan out history, survive a dead backend"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_histospec.pipe.planner import POLICIES
    from sglang_histospec.router.recovery import REPLAY_MAX_BYTES, REPLAY_STEPS

    parser.add_argument("--backends", required=True, help="comma-separated base URLs of rollout servers")
    parser.add_argument("--policy", choices=POLICIES, default="histopipe")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    from sglang_histospec.server.launch import add_common_arguments

    add_common_arguments(parser)  # the admin key is also sent to the backends
    parser.add_argument("--health-interval-s", type=float, default=2.0)
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--replay-steps",
        type=int,
        default=REPLAY_STEPS,
        help="history pushes of this many newest steps are replayed to a backend that comes back or is added",
    )
    parser.add_argument(
        "--replay-max-bytes",
        type=int,
        default=REPLAY_MAX_BYTES,
        help="bound on the pushes kept for replay (oldest go)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="one-step overlap (one step off-policy): a step returns without its deferred stragglers, which come "
        "back with the next step ('carried') or POST /histopipe/drain",
    )
    parser.add_argument(
        "--trace-path",
        default=None,
        help="append every answer to this trace (.jsonl or .jsonl.gz), one write per call, for `histospec replay`",
    )
    parser.add_argument(
        "--max-deferrals",
        type=int,
        default=1,
        help="with --overlap: times a request may be deferred (more: shorter steps, but each deferral leaves its "
        "response one more step off-policy)",
    )


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.pipe.planner import PlannerConfig
    from sglang_histospec.router.app import create_app
    from sglang_histospec.router.config import RouterConfig
    from sglang_histospec.router.router import Router
    from sglang_histospec.server.launch import check_bind, limits_from_args, run_app

    try:
        check_bind(args.host, args.admin_api_key)
        config = RouterConfig(
            backends=[u for u in args.backends.split(",") if u],
            policy=args.policy,
            admin_api_key=args.admin_api_key,
            health_interval_s=args.health_interval_s,
            request_timeout_s=args.request_timeout_s,
            replay_steps=args.replay_steps,
            replay_max_bytes=args.replay_max_bytes,
            limits=limits_from_args(args),
            max_request_bytes=args.max_request_bytes,
            overlap=args.overlap,
            trace_path=args.trace_path,
            planner=PlannerConfig(
                policy=args.policy,
                max_deferrals=args.max_deferrals,
            ),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    router = Router(config)
    router.start()
    try:
        run_app(
            create_app(router),
            args.host,
            args.port,
            args.admin_api_key,
            args.log_level,
            on_signal=router.begin_shutdown,
        )
    finally:
        router.close()
    return 0
