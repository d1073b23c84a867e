"""Run an app with uvicorn, refusing to listen beyond loopback without an admin key; no torch import.

Example::

    check_bind("0.0.0.0", admin_api_key=None)   # ValueError: refuses to listen beyond loopback without a key
    run_app(create_app(backend), host="127.0.0.1", port=30000)
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to loopback addresses (``localhost``)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments ``histospec serve`` and ``histospec route`` share: the admin key and every client limit."""
    from sglang_histospec.server.schemas import RequestLimits

    parser.add_argument(
        "--admin-api-key",
        default=os.environ.get("HISTOSPEC_ADMIN_API_KEY") or None,
        help="guards history, end_step, weight, flush and abort routes (Authorization: Bearer KEY); "
        "default $HISTOSPEC_ADMIN_API_KEY",
    )
    parser.add_argument("--max-request-bytes", type=int, default=64 * 2**20, help="larger bodies get 413")
    for f in dataclasses.fields(RequestLimits):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=int, default=f.default, help=f"client limit (400 above it); {f.name}")


def limits_from_args(args: argparse.Namespace) -> Any:
    """The ``RequestLimits`` of parsed ``add_common_arguments`` (ValueError on a bad value)."""
    from sglang_histospec.server.schemas import RequestLimits

    return RequestLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RequestLimits)})


def drafter_fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``DrafterConfig`` fields that ``histospec serve``'s drafter flags set (only those given).

    Example: ``--scorer counts --draft-threads 2`` -> ``{"scorer": "counts", "draft_threads": 2}``; ``--draft-mode
    chain`` -> ``{"tree": False, "scorer": "counts"}`` (chain drafts are the counts scorer's mode).
    """
    chain = getattr(args, "draft_mode", "tree") == "chain"
    fields: dict[str, Any] = {"tree": False} if chain else {}
    if getattr(args, "scorer", None) is not None or chain:
        fields["scorer"] = getattr(args, "scorer", None) or "counts"
    for flag, field in (("history_window", "window"), ("draft_threads", "draft_threads")):
        if getattr(args, flag, None) is not None:
            fields[field] = getattr(args, flag)
    return fields


def check_bind(host: str, admin_api_key: str | None) -> None:
    """Raise ValueError when ``host`` is not loopback and no admin key is set."""
    if not is_loopback(host) and not admin_api_key:
        raise ValueError(
            f"--host {host} listens beyond loopback, where anyone could push history or replace the weights; "
            "set --admin-api-key KEY (or HISTOSPEC_ADMIN_API_KEY), or use --host 127.0.0.1"
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_app(
    app: Any,
    host: str,
    port: int,
    admin_api_key: str | None = None,
    log_level: str = "info",
    on_signal: Callable[[], None] | None = None,
    shutdown_timeout_s: float = 10.0,
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM. ``on_signal`` runs at the signal (abort what runs, so answers go out at
    once); connections still open after ``shutdown_timeout_s`` are closed; then the app's shutdown runs (the
    backend snapshots its history)."""
    import uvicorn

    check_bind(host, admin_api_key)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_signal is not None and not self.should_exit:
                on_signal()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout_s
    )
    _Server(config).run()
