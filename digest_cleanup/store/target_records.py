"""Each target's state in Redis: slot locks, last success, latency, timings, verify results,
and the scope whose conditions probe last passed.

These keys outlive any one run.  A run's scripts write the latency histogram,
the timings and the latest run id under the names given here (see
:mod:`digest_cleanup.store.runs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from digest_cleanup.clock import now_iso
from digest_cleanup.store.keys import Keyspace, as_text, release

#: Upper bounds (seconds) of the enqueue-to-acknowledgement latency histogram.
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class TargetState(Keyspace):
    """Reads and writes the state of targets, by target name."""

    def latest_key(self, target: str) -> str:
        """The id of the target's most recent run."""
        return self.key("target", target, "latest")

    def latency_key(self, target: str) -> str:
        """The target's enqueue-to-acknowledgement histogram, a hash."""
        return self.key("latency", target)

    def timings_key(self, target: str) -> str:
        """The target's recent attempt timings, a list, newest first."""
        return self.key("timings", target)

    def lock_slot(self, target: str, slot: str, holder: str, seconds: int) -> bool:
        """Lock a target's scheduled slot for ``holder`` (a trigger's task id), once.

        True for the first lock and for the same holder again (its redelivery must
        still start the run); False when another holder has it.
        """
        lock = self.lock(self.key("slot", target, slot), holder, seconds)
        return bool(lock.acquire(token=holder)) or lock.owned()

    def unlock_slot(self, target: str, slot: str, holder: str) -> None:
        """Free a slot lock, if ``holder`` still has it (its run could not start)."""
        release(self.lock(self.key("slot", target, slot), holder))

    def mark_success(self, target: str) -> None:
        """Record now as the target's last complete run."""
        self.redis.set(self.key("target", target, "last_success"), now_iso())

    def last_success(self, target: str) -> str | None:
        raw = self.redis.get(self.key("target", target, "last_success"))
        return None if raw is None else as_text(raw)

    def mark_probed(self, target: str, scope: str) -> None:
        """Record that the store honoured delete conditions for the target's ``scope`` digest.

        A run of that scope then starts without probing again.  Lost with Redis's
        data, which only costs the next run a probe.
        """
        self.redis.hset(
            self.key("target", target, "probed"), mapping={"scope": scope, "at": now_iso()}
        )

    def probed_scope(self, target: str) -> str | None:
        """The scope digest whose conditions probe last passed for the target, if any."""
        raw = self.redis.hget(self.key("target", target, "probed"), "scope")
        return None if raw is None else as_text(raw)

    def latency(self, target: str) -> dict[str, str]:
        """The target's enqueue-to-acknowledgement histogram (bucket -> count, sum, count)."""
        raw = self.redis.hgetall(self.latency_key(target))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def save_verify(self, target: str, result: Mapping[str, Any]) -> None:
        """Keep the target's latest ``verify`` result, which the metrics read."""
        self.redis.hset(
            self.key("target", target, "verify"), mapping={k: str(v) for k, v in result.items()}
        )

    def last_verify(self, target: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.key("target", target, "verify"))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def latest(self, target: str) -> str | None:
        raw = self.redis.get(self.latest_key(target))
        return None if raw is None else as_text(raw)

    def timings(self, target: str, limit: int = 2000) -> list[tuple[float, float, int]]:
        """Recent attempts of a target, newest first: (attempt s, delete s, keys)."""
        raw = self.redis.lrange(self.timings_key(target), 0, limit - 1)
        rows = []
        for line in raw:
            service, delete, keys = as_text(line).split()
            rows.append((float(service), float(delete), int(keys)))
        return rows
