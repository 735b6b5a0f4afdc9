"""Free TCP ports for servers this process starts (a stack, a function instance)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now (the kernel picks it; another process
    may take it before it is bound again, so callers retry a failed start)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
