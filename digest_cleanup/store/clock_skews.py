"""Redis's clock, and the wide clock skews the retention check saw, by target.

The skews live in one hash (``clock_skew``), each field ``"SKEW AT"``: seconds of
skew, and when it was seen by Redis's clock, the one every host and the metrics
share.  :mod:`~digest_cleanup.pipeline.trusted_clock` decides what counts as wide.
"""

from __future__ import annotations

from datetime import UTC, datetime

import redis

from digest_cleanup.store.connection import as_text
from digest_cleanup.store.keys import Keys


class ClockSkews:
    """Reads Redis's clock; records and reads the skews seen per target."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def redis_now(self) -> datetime:
        """Redis's clock (``TIME``), in UTC."""
        seconds, micros = self.client.time()
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    def record(self, target: str, skew: float, at: float) -> None:
        """Keep ``skew`` seconds as the target's last wide skew, seen at epoch ``at``."""
        self.client.hset(self.keys.clock_skews(), target, f"{round(skew, 1)} {at:.0f}")

    def recent(self, now: float, window: float) -> dict[str, float]:
        """The last wide skew of each target that saw one within ``window`` s of ``now``."""
        skews: dict[str, float] = {}
        for field, value in self.client.hgetall(self.keys.clock_skews()).items():
            skew, _, at = as_text(value).partition(" ")
            if at and now - float(at) <= window:
                skews[as_text(field)] = float(skew)
        return skews
