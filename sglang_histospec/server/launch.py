"""Run an app with uvicorn, refusing to listen beyond loopback without an admin key; no torch import.

Example::

    check_bind("0.0.0.0", admin_api_key=None)   # ValueError: refuses to listen beyond loopback without a key
    run_app(create_app(backend), host="127.0.0.1", port=30000)
"""

from __future__ import annotations

import ipaddress
import socket
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


def run_app(app: Any, host: str, port: int, admin_api_key: str | None = None, log_level: str = "info") -> None:
    """Serve ``app`` until interrupted (SIGINT/SIGTERM shut it down cleanly: the backend snapshots history)."""
    import uvicorn

    check_bind(host, admin_api_key)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30)
