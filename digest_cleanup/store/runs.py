"""The run store: everything the project keeps in Redis, behind one object.

:class:`RunStore` holds one client and one :class:`~digest_cleanup.store.keys.Keys`,
and is composed of parts that each own their keys and the scripts that change them:

* ``runs`` (:mod:`~digest_cleanup.store.run_records`): each run's record and its
  transitions (open, record an attempt, fail, abort);
* ``sweeps`` (:mod:`~digest_cleanup.store.sweeps`): the sweep lease, the
  checkpoint and the staged batches;
* ``targets`` (:mod:`~digest_cleanup.store.target_records`): each target's slot
  locks and own records;
* ``clock_skews`` (:mod:`~digest_cleanup.store.clock_skews`): Redis's clock and the
  skews the retention check saw;
* :meth:`RunStore.dead_letter_queue` and :meth:`RunStore.budget` build the
  dead-letter queue (:mod:`~digest_cleanup.store.dead_letters`) and a target's
  delete budget (:mod:`~digest_cleanup.store.budget`) on the same client and keys.

A part's script that must move another part's keys in the same atomic step
includes that part's fragment (see :mod:`~digest_cleanup.store.scripts`); no part
writes another's keys itself.  Callers name the part they use:
``store.runs.record(...)``, ``store.sweeps.stage(...)``, ``store.targets.lock_slot(...)``.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from digest_cleanup.store.budget import DeleteBudget
from digest_cleanup.store.clock_skews import ClockSkews
from digest_cleanup.store.dead_letters import DeadLetterQueue
from digest_cleanup.store.keys import Keys
from digest_cleanup.store.run_records import RunRecords
from digest_cleanup.store.sweeps import Sweeps
from digest_cleanup.store.target_records import TargetRecords


class RunStore:
    """One Redis client and one keyspace, and the parts of the store on them."""

    def __init__(self, client: redis.Redis, prefix: str = "dc") -> None:
        self.redis = client
        self.keys = Keys(prefix)
        self.runs = RunRecords(client, self.keys)
        self.sweeps = Sweeps(client, self.keys)
        self.targets = TargetRecords(client, self.keys)
        self.clock_skews = ClockSkews(client, self.keys)

    def key(self, *parts: str) -> str:
        """``prefix:part:part`` (see :class:`~digest_cleanup.store.keys.Keys`)."""
        return self.keys.key(*parts)

    def run_key(self, run_id: str, suffix: str = "") -> str:
        """The run's hash, or one of its ``run:ID:suffix`` keys."""
        return self.keys.run(run_id, suffix)

    def reset(self, run_id: str) -> None:
        """Forget a run entirely, so the same run id can start over: one atomic step."""
        pipe = self.redis.pipeline()
        self.runs.forget(run_id, pipe)
        self.sweeps.forget(run_id, pipe)
        pipe.execute()

    def expire(self, run_id: str) -> None:
        """Let a finished run's state age out of Redis."""
        pipe = self.redis.pipeline()
        self.runs.expire(run_id, pipe)
        self.sweeps.expire(run_id, pipe)
        pipe.execute()

    def dead_letter_queue(
        self, *, queue: str, work_queue: str, work_exchange: str = "", work_routing_key: str = ""
    ) -> DeadLetterQueue:
        """The dead-letter queue on this store's client and keys (see its class)."""
        return DeadLetterQueue(
            self.redis,
            self.keys,
            queue=queue,
            work_queue=work_queue,
            work_exchange=work_exchange,
            work_routing_key=work_routing_key,
        )

    def budget(
        self, target: str, ceiling: float, *, sleep: Callable[[float], None] | None = None
    ) -> DeleteBudget:
        """Target ``target``'s shared delete budget of ``ceiling`` keys a second."""
        if sleep is None:
            return DeleteBudget(self.redis, self.keys, target, ceiling)
        return DeleteBudget(self.redis, self.keys, target, ceiling, sleep=sleep)
