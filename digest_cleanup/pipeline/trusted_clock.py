"""One trusted "now" for the retention check: the earliest of the clocks a worker can read.

A worker (or beat) whose clock runs fast would compute a cutoff inside the
retention window, and check it against that same fast clock.  So every
retention check takes the earliest of:

* this process's clock;
* Redis's ``TIME`` (one clock every host of a deployment shares);
* the store's own clock, where the kind has one (S3's ``Date`` header).

The earliest is the safe side: an earlier "now" gives an earlier latest cutoff,
so a fast clock can only make a check stricter, never looser.  A spread of more
than :data:`SKEW_WARN_SECONDS` between them is logged, counted per target in
Redis (``digest_cleanup_clock_skew_seconds`` in the metrics) and shown by
``check``.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

import redis

from digest_cleanup.clock import utcnow
from digest_cleanup.kinds import TargetKind
from digest_cleanup.store.clock_skews import ClockSkews
from digest_cleanup.store.runs import RunStore

logger = logging.getLogger("digest_cleanup.clock")

#: A spread between the clocks past this many seconds is logged and counted.
SKEW_WARN_SECONDS = 120.0
#: How long a wide skew, once seen, is still reported (the metric and ``check``): a
#: clock fixed since stops being reported without anyone clearing it.
SKEW_REPORT_SECONDS = 900.0


@dataclasses.dataclass(frozen=True)
class Reading:
    """What each clock said, and the one the retention check uses."""

    local: datetime
    redis: datetime | None
    store: datetime | None

    @property
    def now(self) -> datetime:
        """The earliest clock, to the second (cutoffs are never finer)."""
        clocks = [c for c in (self.local, self.redis, self.store) if c is not None]
        return min(clocks).replace(microsecond=0)

    @property
    def skew(self) -> float:
        """Seconds between the latest and the earliest clock."""
        clocks = [c for c in (self.local, self.redis, self.store) if c is not None]
        return (max(clocks) - min(clocks)).total_seconds()

    def as_dict(self) -> dict[str, str | float | None]:
        return {
            "local": self.local.isoformat(),
            "redis": self.redis.isoformat() if self.redis else None,
            "store": self.store.isoformat() if self.store else None,
            "now": self.now.isoformat(),
            "skew_seconds": round(self.skew, 1),
        }


def read(clocks: ClockSkews, kind: TargetKind | None = None) -> Reading:
    """Read the clocks; one that cannot be read is left out, never guessed."""
    local = utcnow()
    try:
        shared: datetime | None = clocks.redis_now()
    except redis.RedisError:
        shared = None
    return Reading(local, shared, kind.server_time() if kind is not None else None)


def trusted_now(store: RunStore, kind: TargetKind | None = None, *, target: str = "") -> datetime:
    """The earliest of the clocks (see the module docstring); a wide spread is counted."""
    reading = read(store.clock_skews, kind)
    if reading.skew > SKEW_WARN_SECONDS:
        logger.warning(
            "clock skew of %.0f s between this host, Redis and the store (%s); the retention "
            "check uses the earliest. Fix the fast clock (NTP)",
            reading.skew,
            reading.as_dict(),
        )
        if target:
            try:
                # When, by Redis's clock: the one every host and the metrics share.
                at = (reading.redis or reading.local).timestamp()
                store.clock_skews.record(target, reading.skew, at)
            except redis.RedisError:
                logger.debug("could not record the clock skew of target %s", target)
    return reading.now


def recorded_skews(store: RunStore, now: float | None = None) -> dict[str, float]:
    """The wide skew seen per target in the last :data:`SKEW_REPORT_SECONDS` (else none).

    ``now`` is Redis's clock unless given, as the skew was stamped with it.
    """
    clocks = store.clock_skews
    now = clocks.redis_now().timestamp() if now is None else now
    return clocks.recent(now, SKEW_REPORT_SECONDS)
