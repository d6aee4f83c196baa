"""One delete budget per target, shared by every worker process on every host.

AWS S3 allows about 3,500 writes per second per partitioned prefix, and every
key of a DeleteObjects counts as one write.  Nothing in the stack holds a fleet
under that: Celery's ``rate_limit`` is per worker process, boto3's adaptive mode
per client and counts requests, not keys.  So the budget lives in Redis, where
every worker already is, and one Lua script per transition keeps it atomic.

**Spacing.**  The budget is a GCRA (the generic cell rate algorithm, a token
bucket kept as one timestamp): ``tat`` is the moment the budget is spent up to.
A batch of *n* keys reserves ``n / rate`` seconds after ``tat`` and is told how
long to wait before sending; up to :data:`BURST_SECONDS` of budget may go at
once.  A reservation is a place in line, so waiting batches go in order and no
one polls.  The clock is Redis's ``TIME``, the same for every host.

**Adapting (AIMD).**  A SlowDown in any of its forms lowers the shared rate by
:data:`DECREASE_FACTOR` for everyone at once, at most once per
:data:`DECREASE_EVERY` (the requests in flight when S3 pushed back are one
signal, not sixty-four).  Each :data:`INCREASE_EVERY` without one raises it by
:data:`INCREASE_SHARE` of the ceiling, up to the ceiling the target configures.
A ``Retry-After`` or ``x-amz-retry-after`` pauses the budget for that long.  A
decrease or a pause bumps the budget's *epoch*: a batch still waiting on a
reservation made before it checks the epoch when it wakes and reserves again at
the new rate, so a throttle slows the very next requests, not those after the
queue already reserved.

**Waiting is not retrying.**  A wait spends no retry and counts no delivery.  A
wait longer than a batch may hold its message (see :func:`longest_wait`) is not
reserved at all: the caller hands the batch back with a short countdown.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import redis

from digest_cleanup.kinds import KeyResult
from digest_cleanup.store.connection import as_text
from digest_cleanup.store.keys import Keys
from digest_cleanup.store.scripts import Script

#: Seconds of budget one moment may spend at once: a little over one 500-key batch at
#: 3,300 keys/s, well inside the second of burst S3 is reported to absorb.
BURST_SECONDS = 0.25
#: A SlowDown multiplies the shared rate by this.
DECREASE_FACTOR = 0.7
#: Seconds within which further SlowDowns count as the same signal.
DECREASE_EVERY = 1.0
#: Seconds of no SlowDown after which the rate rises by one step.
INCREASE_EVERY = 1.0
#: One step of the rise, as a share of the ceiling: from the floor back to the
#: ceiling in about 20 s.
INCREASE_SHARE = 0.05
#: The rate never falls below this share of the ceiling.
FLOOR_SHARE = 0.02
#: The longest any wait may be, whatever the visibility timeout allows.
MAX_WAIT_SECONDS = 30.0
#: A held message may wait at most this share of the visibility timeout, so Redis
#: never hands it to a second worker while the first still waits.
WAIT_SHARE_OF_VISIBILITY = 0.25
#: The longest countdown of a batch handed back because its wait was too long: short,
#: so it looks again soon, and far inside any visibility timeout.
DEFER_SECONDS = 5.0
#: A budget nobody drew on for this long is forgotten (its rate starts at the ceiling).
IDLE_TTL_MS = 24 * 3600 * 1000


@dataclasses.dataclass(frozen=True)
class Grant:
    """The answer to one reservation."""

    #: False: the wait would have been longer than allowed, and nothing was reserved.
    granted: bool
    #: Seconds to wait before sending (for a refusal: how long the wait would be).
    wait: float
    epoch: int
    rate: float


@dataclasses.dataclass(frozen=True)
class Drawn:
    """What one batch's draw on the budget came to."""

    #: False: the budget could not be had within the allowed wait; hand the batch back.
    granted: bool
    #: Seconds the batch waited (or, refused, the wait it was not given).
    waited: float
    #: The shared rate when the budget was granted.
    rate: float


@dataclasses.dataclass(frozen=True)
class BudgetState:
    """A budget as ``status`` and the metrics endpoint show it."""

    target: str
    ceiling: float
    #: The shared rate now (the ceiling unless S3 pushed back lately).
    rate: float
    #: Seconds the budget stays paused for a Retry-After, or 0.
    paused_for: float
    throttles: int
    decreases: int
    pauses: int
    waits: int
    wait_seconds: float
    #: Batches handed back because their wait would have been too long.
    deferred: int
    reserved_keys: int

    def as_dict(self) -> dict[str, float | int | str]:
        return dataclasses.asdict(self)


class DeleteBudget:
    """The keys-per-second budget of one target (see :meth:`RunStore.budget`)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys | str,
        target: str,
        ceiling: float,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if ceiling <= 0:
            raise ValueError(f"a delete budget needs a positive rate, not {ceiling}")
        self.redis = client
        self.target = target
        self.ceiling = float(ceiling)
        # A bare prefix is the same keyspace the store would give (tests build budgets so).
        self.key = (keys if isinstance(keys, Keys) else Keys(keys)).budget(target)
        self._sleep = sleep
        self._reserve = Script(client, "budget_reserve.lua")
        self._throttled = Script(client, "budget_throttled.lua")
        self._peek = Script(client, "budget_peek.lua")

    def reserve(self, keys: int, max_wait: float) -> Grant:
        """Reserve ``keys`` keys of budget, unless the wait would pass ``max_wait`` seconds."""
        granted, wait, epoch, rate = self._reserve(
            keys={"budget": self.key},
            args={
                "keys": keys,
                "max_wait": max_wait,
                "ceiling": self.ceiling,
                "burst": BURST_SECONDS,
                "increase_every": INCREASE_EVERY,
                "increase_share": INCREASE_SHARE,
                "ttl": IDLE_TTL_MS,
            },
        )
        return Grant(int(granted) == 1, float(wait), int(float(epoch)), float(rate))

    def draw(self, keys: int, max_wait: float) -> Drawn:
        """Wait for ``keys`` keys of budget; reserve again if S3 pushed back meanwhile."""
        waited = 0.0
        while True:
            grant = self.reserve(keys, max(0.0, max_wait - waited))
            if not grant.granted:
                return Drawn(False, grant.wait, grant.rate)
            if grant.wait <= 0:
                return Drawn(True, waited, grant.rate)
            self._sleep(grant.wait)
            waited += grant.wait
            if self.epoch() == grant.epoch:
                return Drawn(True, waited, grant.rate)

    def throttled(self, pause: float | None = None) -> float:
        """S3 answered SlowDown: lower the shared rate, and pause it for ``pause`` seconds."""
        rate, _epoch, _paused = self._throttled(
            keys={"budget": self.key},
            args={
                "ceiling": self.ceiling,
                "factor": DECREASE_FACTOR,
                "floor_share": FLOOR_SHARE,
                "every": DECREASE_EVERY,
                "pause": pause or 0.0,
                "burst": BURST_SECONDS,
                "increase_every": INCREASE_EVERY,
                "increase_share": INCREASE_SHARE,
                "ttl": IDLE_TTL_MS,
            },
        )
        return float(rate)

    def report(self, results: Sequence[KeyResult], throttle_codes: frozenset[str]) -> None:
        """Lower the shared rate if the store throttled any key, pausing it if it said how long.

        Only the throttled keys retry, as any transient failure does; the budget is
        what slows every other worker down with them.
        """
        throttled = [r for r in results if r.code in throttle_codes]
        if throttled:
            pauses = [r.retry_after for r in throttled if r.retry_after]
            self.throttled(max(pauses) if pauses else None)

    def epoch(self) -> int:
        raw = self.redis.hget(self.key, "epoch")
        return int(float(as_text(raw))) if raw is not None else 0

    def state(self) -> BudgetState:
        """The budget as it stands (a budget never drawn on reads as its ceiling)."""
        rate, paused_for = self._peek(
            keys={"budget": self.key},
            args={
                "ceiling": self.ceiling,
                "increase_every": INCREASE_EVERY,
                "increase_share": INCREASE_SHARE,
            },
        )
        raw = {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.key).items()}
        return BudgetState(
            target=self.target,
            ceiling=self.ceiling,
            rate=float(rate),
            paused_for=float(paused_for),
            throttles=int(raw.get("throttles", 0)),
            decreases=int(raw.get("decreases", 0)),
            pauses=int(raw.get("pauses", 0)),
            waits=int(raw.get("waits", 0)),
            wait_seconds=round(float(raw.get("wait_seconds", 0)), 3),
            deferred=int(raw.get("deferred", 0)),
            reserved_keys=int(raw.get("reserved_keys", 0)),
        )


def longest_wait(visibility_timeout: float) -> float:
    """The longest a batch may wait for budget while it holds its message."""
    return min(MAX_WAIT_SECONDS, visibility_timeout * WAIT_SHARE_OF_VISIBILITY)
