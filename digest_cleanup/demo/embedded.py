"""The demo's own servers and Celery processes, in one temporary directory, and their stopping."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import digest_cleanup
from digest_cleanup.demo.artifacts import AUDIT_BUCKET, targets_toml
from digest_cleanup.demo.phases import say
from digest_cleanup.demo.servers import RedisServer, WeedServer
from digest_cleanup.demo.stack import Stack


class EmbeddedStack:
    """Redis, ``weed mini`` and the demo's Celery processes, all under one temporary directory."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="digest-cleanup-demo-"))
        self.redis = RedisServer(data_dir=self.workdir / "redis")
        self.weed = WeedServer(data_dir=self.workdir / "weed")
        self._stack: Stack | None = None

    @property
    def stack(self) -> Stack:
        """The worker and CLI processes, once :meth:`configure` has prepared them."""
        if self._stack is None:
            raise RuntimeError("the stack is not configured yet; call configure() first")
        return self._stack

    def start_servers(self) -> None:
        """Start Redis and S3 on free loopback ports, and say where they listen."""
        self.redis.start()
        self.weed.start()
        say(f"    redis {self.redis.url}   s3 {self.weed.endpoint_url}")

    def configure(self, bucket: str) -> Stack:
        """Write the targets file and prepare the worker and CLI processes (none started yet)."""
        # The workers import this package from wherever the demo imported it, even from
        # a source tree that is not installed.
        package_root = str(Path(digest_cleanup.__file__).resolve().parents[1])
        pythonpath = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        self._stack = Stack(
            self.workdir / "stack",
            redis_url=self.redis.url,
            s3_endpoint_url=self.weed.endpoint_url,
            targets_toml=targets_toml(bucket),
            env={"PYTHONPATH": pythonpath, "CLEANUP_AUDIT_URL": f"s3://{AUDIT_BUCKET}/reports/"},
        )
        return self._stack

    def stop(self, *, keep_files: bool) -> None:
        """Stop every process and server, say whether any is left, and remove the directory.

        With ``keep_files`` the directory stays, and its place is said, for its logs.
        """
        say("==> stopping everything")
        stopping = time.perf_counter()
        processes = list(self._stack.processes) if self._stack is not None else []
        if self._stack is not None:
            self._stack.stop()
        self.weed.stop()
        self.redis.stop()
        left = [p.name for p in processes if p.alive()]
        left += [s.name for s in (self.weed, self.redis) if s.is_running()]
        say(
            f"    stopped in {time.perf_counter() - stopping:.1f} s; "
            + (f"STILL RUNNING: {', '.join(left)}" if left else "nothing left running")
        )
        if keep_files:
            say(f"    logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
