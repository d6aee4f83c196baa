"""What every part of the store does with its one Redis client: token locks, replies as text."""

from __future__ import annotations

import contextlib
from typing import Any

import redis
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock


def token_lock(client: redis.Redis, key: str, token: str, seconds: float | None = None) -> Lock:
    """A non-blocking lock on ``key`` held under ``token``, the value stored at ``key``.

    The token is explicit rather than per thread: whoever knows it (the slice
    that took the lease, a redelivered trigger) is the holder.
    """
    lock = Lock(client, key, timeout=seconds, blocking=False, thread_local=False)
    lock.local.token = token.encode()
    return lock


def release(lock: Lock) -> None:
    """Free ``lock`` if its token still holds it; one that expired or was taken over stays."""
    with contextlib.suppress(LockNotOwnedError):
        lock.release()


def as_text(value: Any) -> str:
    """A Redis reply as text (redis-py returns bytes unless told otherwise)."""
    return value.decode() if isinstance(value, bytes) else str(value)
