"""Each target's own record in Redis: slot locks, last success, verify results, and the
scope whose conditions probe last passed.

These keys outlive any one run.  What the target's runs and attempts write (its
latest run, latency and timings) is the run part's
(:mod:`~digest_cleanup.store.run_records`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from digest_cleanup.clock import now_iso
from digest_cleanup.store.connection import as_text, release, token_lock
from digest_cleanup.store.keys import Keys


class TargetRecords:
    """Reads and writes the records of targets, by target name."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def lock_slot(self, target: str, slot: str, holder: str, seconds: int) -> bool:
        """Lock a target's scheduled slot for ``holder`` (a trigger's task id), once.

        True for the first lock and for the same holder again (its redelivery must
        still start the run); False when another holder has it.
        """
        lock = token_lock(self.client, self.keys.slot(target, slot), holder, seconds)
        return bool(lock.acquire(token=holder)) or lock.owned()

    def unlock_slot(self, target: str, slot: str, holder: str) -> None:
        """Free a slot lock, if ``holder`` still has it (its run could not start)."""
        release(token_lock(self.client, self.keys.slot(target, slot), holder))

    def mark_success(self, target: str) -> None:
        """Record now as the target's last complete run."""
        self.client.set(self.keys.target(target, "last_success"), now_iso())

    def last_success(self, target: str) -> str | None:
        raw = self.client.get(self.keys.target(target, "last_success"))
        return None if raw is None else as_text(raw)

    def mark_probed(self, target: str, scope: str) -> None:
        """Record that the store honoured delete conditions for the target's ``scope`` digest.

        A run of that scope then starts without probing again.  Lost with Redis's
        data, which only costs the next run a probe.
        """
        self.client.hset(
            self.keys.target(target, "probed"), mapping={"scope": scope, "at": now_iso()}
        )

    def probed_scope(self, target: str) -> str | None:
        """The scope digest whose conditions probe last passed for the target, if any."""
        raw = self.client.hget(self.keys.target(target, "probed"), "scope")
        return None if raw is None else as_text(raw)

    def save_verify(self, target: str, result: Mapping[str, Any]) -> None:
        """Keep the target's latest ``verify`` result, which the metrics read."""
        self.client.hset(
            self.keys.target(target, "verify"), mapping={k: str(v) for k, v in result.items()}
        )

    def last_verify(self, target: str) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.target(target, "verify"))
        return {as_text(k): as_text(v) for k, v in raw.items()}
