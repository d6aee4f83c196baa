"""The AWS model's arithmetic: write partitions, token buckets and latency draws.

Each piece is small and pure, so it can be tested without a proxy or a clock:
:func:`partition_of` says which budget a key's writes count against, :class:`WriteBudget`
holds one token bucket per partition, and :func:`draw_latency` draws one request's
latency.  :mod:`tests.rig.aws_model` says what each stands for and where the numbers
come from.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

__all__ = [
    "DELETE_BASE",
    "DELETE_PER_KEY",
    "LATENCY_CLAMP",
    "LATENCY_SIGMA",
    "LIST_BASE",
    "OTHER_BASE",
    "WRITE_RATE",
    "Partition",
    "WriteBudget",
    "delete_latency_median",
    "draw_latency",
    "partition_of",
]

#: S3's documented writes per second per partitioned prefix.
WRITE_RATE = 3_500.0
#: Median seconds of a DeleteObjects before its per-key cost.
DELETE_BASE = 0.030
#: Median seconds each key adds to a DeleteObjects.
DELETE_PER_KEY = 0.0002
#: Median seconds of one list page (ListObjectsV2).
LIST_BASE = 0.040
#: Median seconds of any other request, and of a throttled answer.
OTHER_BASE = 0.010
#: The sigma of the lognormal factor on each median; 0.3 puts the 99th percentile at 2x.
LATENCY_SIGMA = 0.3
#: No draw exceeds this many times its median, so one unlucky draw cannot stall a test.
LATENCY_CLAMP = 4.0

#: A write budget's unit: (bucket, first path segment of the key with its "/", or "").
Partition = tuple[str, str]


def partition_of(bucket: str, key: str) -> Partition:
    """The partition a key's writes are counted in: ``("b", "statements/")`` or ``("b", "")``."""
    slash = key.find("/")
    return (bucket, key[: slash + 1] if slash >= 0 else "")


def delete_latency_median(keys: int) -> float:
    """The median latency, in seconds, of a DeleteObjects of ``keys`` keys."""
    return DELETE_BASE + DELETE_PER_KEY * keys


def draw_latency(
    median: float,
    rng: random.Random,
    *,
    sigma: float = LATENCY_SIGMA,
    clamp: float = LATENCY_CLAMP,
) -> float:
    """One latency around ``median``: ``median * lognormal(0, sigma)``, at most ``clamp * median``.

    The lognormal factor has a median of 1, so half the draws fall below ``median``.
    """
    return min(median * rng.lognormvariate(0.0, sigma), median * clamp)


class WriteBudget:
    """One token bucket per partition: ``rate`` tokens a second, at most ``capacity``.

    Buckets start full.  Times are given by the caller (``time.monotonic()``
    seconds), so the arithmetic can be tested without waiting.  Not thread-safe:
    :class:`AwsModel` calls it under its lock.
    """

    def __init__(self, rate: float, capacity: float) -> None:
        if not rate > 0 or not capacity >= 1:
            raise ValueError(f"need rate > 0 and capacity >= 1, not {rate} and {capacity}")
        self.rate = rate
        self.capacity = capacity
        # partition -> [tokens, the time they were counted at]
        self._buckets: dict[Partition, list[float]] = {}

    def tokens(self, partition: Partition, now: float) -> float:
        """The tokens ``partition`` holds at ``now``, after refilling."""
        bucket = self._buckets.get(partition)
        if bucket is None:
            bucket = self._buckets[partition] = [self.capacity, now]
        elif now > bucket[1]:
            bucket[0] = min(self.capacity, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
        return bucket[0]

    def take_all(self, needs: Mapping[Partition, int], now: float) -> bool:
        """Take every token ``needs`` asks for, or none: True if they were all there."""
        if any(self.tokens(p, now) < n for p, n in needs.items()):
            return False
        for partition, n in needs.items():
            self._buckets[partition][0] -= n
        return True

    def take_some(self, needs: Mapping[Partition, int], now: float) -> dict[Partition, int]:
        """Take, in each partition, as many whole tokens of its need as it holds."""
        granted: dict[Partition, int] = {}
        for partition, n in needs.items():
            granted[partition] = min(n, math.floor(self.tokens(partition, now)))
            self._buckets[partition][0] -= granted[partition]
        return granted
