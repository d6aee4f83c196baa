"""The run store's Redis keyspace: key names under one prefix, token locks, replies as text."""

from __future__ import annotations

import contextlib
from typing import Any

import redis
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

#: How long a finished run's state stays in Redis; the audit report is the durable record.
RUN_TTL_SECONDS = 35 * 24 * 3600
#: The keys of one run's state: its hash (no suffix) and the ``run:ID:SUFFIX`` keys.
RUN_KEY_SUFFIXES = (
    "",
    "checkpoint",
    "claims",
    "pending",
    "retry_codes",
    "retried_codes",
    "deliveries",
    "staged",
    "skipped_keys",
    "sweep_lease",
    "progress",
    "published",
    "redriven",
    "chains",
)


class Keyspace:
    """Key names of the run store under one prefix (``dc`` unless configured)."""

    def __init__(self, client: redis.Redis, prefix: str = "dc") -> None:
        self.redis = client
        self.prefix = prefix

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def run_key(self, run_id: str, suffix: str = "") -> str:
        return self.key("run", run_id) + (f":{suffix}" if suffix else "")

    def lock(self, key: str, token: str, seconds: float | None = None) -> Lock:
        """A non-blocking lock on ``key`` held under ``token``, the value stored at ``key``.

        The token is explicit rather than per thread: whoever knows it (the slice
        that took the lease, a redelivered trigger) is the holder.
        """
        lock = Lock(self.redis, key, timeout=seconds, blocking=False, thread_local=False)
        lock.local.token = token.encode()
        return lock


def release(lock: Lock) -> None:
    """Free ``lock`` if its token still holds it; one that expired or was taken over stays."""
    with contextlib.suppress(LockNotOwnedError):
        lock.release()


def as_text(value: Any) -> str:
    """A Redis reply as text (redis-py returns bytes unless told otherwise)."""
    return value.decode() if isinstance(value, bytes) else str(value)
