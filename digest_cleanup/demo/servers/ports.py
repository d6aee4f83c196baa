"""The loopback address every server here listens on, and free ports to listen on."""

from __future__ import annotations

import contextlib
import socket

#: Every server here listens on this address only.
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    All the sockets stay bound until every port is picked, so the kernel cannot hand
    out the same port twice.  Another process may still take one before the caller
    binds it; :class:`~digest_cleanup.demo.servers.WeedServer` retries with new
    ports when that happens.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports
