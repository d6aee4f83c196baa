"""The demo's processes: Celery workers, Flower and the CLI against given Redis and S3 servers.

Every process starts in its own session, so it can be killed with its whole group,
and leaves a log file in the stack's directory.  The test suite's stack builds on
this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: How long a worker may take to say it is ready.
READY_TIMEOUT = 60.0


def wait_for(
    condition: Callable[[], Any], timeout: float, message: str, interval: float = 0.1
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s: {message}")
        time.sleep(interval)


class Process:
    """One Celery process started by the stack."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=dict(env),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, marker: str = "ready.", timeout: float = READY_TIMEOUT) -> Process:
        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}):\n{self.output()[-3000:]}"
                )
            return marker in self.output()

        wait_for(ready, timeout, f"{self.name} to log {marker!r}")
        return self

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker and its pool children die at once."""
        self.signal_group(signal.SIGKILL)
        self.proc.wait(30)
        self._log_file.close()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (Celery's warm shutdown) and wait for the process to exit."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.signal_group(signal.SIGKILL)  # stray pool children, if any
        self._log_file.close()
        return code

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.terminate(30)
        else:
            self.signal_group(signal.SIGKILL)


class Stack:
    """Starts digest-cleanup processes wired to one Redis and one S3 endpoint."""

    def __init__(
        self,
        workdir: Path,
        *,
        redis_url: str,
        s3_endpoint_url: str,
        targets_toml: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.targets_file = self.workdir / "targets.toml"
        self.targets_file.write_text(targets_toml)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CLEANUP_", "AWS_"))}
        self.env: dict[str, str] = {
            **base,
            "CLEANUP_BROKER_URL": redis_url,
            "CLEANUP_S3_ENDPOINT_URL": s3_endpoint_url,
            "CLEANUP_TARGETS_FILE": str(self.targets_file),
            "AWS_ACCESS_KEY_ID": "digest-cleanup-test",
            "AWS_SECRET_ACCESS_KEY": "digest-cleanup-test-secret",
            "AWS_REGION": "us-east-1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.processes: list[Process] = []
        self._count = 0

    def executable(self, name: str) -> str:
        """``name`` from this interpreter's scripts directory, so every process runs one install."""
        candidate = Path(sys.executable).parent / name
        return str(candidate) if candidate.exists() else name

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Process:
        self._count += 1
        log = self.workdir / f"{name}-{self._count}.log"
        proc = Process(name, argv, {**self.env, **(env or {})}, log)
        self.processes.append(proc)
        return proc

    def worker(
        self,
        *,
        concurrency: int | None = 2,
        pool: str | None = "prefork",
        queues: str | None = None,
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> Process:
        """Start ``celery -A digest_cleanup worker`` and wait until it is ready.

        ``pool`` and ``concurrency`` None start it as a plain worker does (the app's
        default pool and size).  ``extra`` goes after the worker's own options, and
        ``prefix`` before the command (``nice -n 10``, say).
        """
        self._count += 1
        argv = [
            *prefix,
            self.executable("celery"),
            "-A",
            "digest_cleanup",
            "worker",
            "--loglevel=INFO",
            *([f"--concurrency={concurrency}"] if concurrency else []),
            *([f"--pool={pool}"] if pool else []),
            f"--hostname=w{self._count}@%h",
            "--without-mingle",
            "--without-gossip",
            *extra,
        ]
        if queues:
            argv.append(f"--queues={queues}")
        # Celery lets a configured pool win over --pool=prefork; the setting makes it hold.
        pinned = {"CLEANUP_WORKER_POOL": pool} if pool else {}
        proc = self.start("worker", argv, {**pinned, **(env or {})})
        return proc.wait_ready() if ready else proc

    def cli(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> CliResult:
        """Run ``digest-cleanup ARGS`` to completion."""
        proc = subprocess.run(
            [self.executable("digest-cleanup"), *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class CliResult:
    """Exit code and output of one CLI call."""

    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code = code
        self.stdout = stdout
        self.stderr = stderr

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except ValueError as exc:
            raise AssertionError(
                f"not JSON (exit {self.code}):\n{self.stdout}\nstderr:\n{self.stderr}"
            ) from exc

    def __repr__(self) -> str:
        out, err = self.stdout[-500:], self.stderr[-1500:]
        return f"CliResult(code={self.code}, stdout={out!r}, stderr={err!r})"
