"""A run's sweep state in Redis: the sweep lease, the checkpoint and the staged batches.

One slice at a time sweeps a run: it holds the lease, and its checkpoint, which
only the lease's holder can write, saves how far the listing got together with
the counters the sweep owns (see :mod:`digest_cleanup.pipeline.sweep`).  The
stage is fenced the same way: a slice that lost the lease appends and trims
nothing.  The checkpoint that puts a batch in flight also keeps the batch's
*published digest* (:func:`~digest_cleanup.model.batches.entry_digests`): what
a worker may delete for that batch id, whatever a message says.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from digest_cleanup.clock import now_iso
from digest_cleanup.model.run_view import FINISH_LUA
from digest_cleanup.store.keys import Keyspace, as_text, release

_CHECKPOINT_LUA = (
    FINISH_LUA
    + """
local run, cp, lease, published = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
if redis.call('EXISTS', run) == 0 then return 'missing' end
-- The fence: only the slice holding the sweep lease may write, and writing renews it.
if redis.call('GET', lease) ~= ARGV[5] then return 'fenced' end
redis.call('PEXPIRE', lease, ARGV[6])
local c = cjson.decode(ARGV[1])
redis.call('SET', cp, ARGV[1])
redis.call('HSET', run, 'listed', c.listed, 'expired', c.expired, 'batches', c.seq,
           'sweep_heartbeat', ARGV[2])
redis.call('HSET', run, 'sweep_errors', 0)
-- ARGV[7..] is (batch id, published digest) pairs.  A batch enters flight, and is
-- counted in it, once: a chunk sent again keeps the digest it was first published with.
for i = 7, #ARGV, 2 do
  if redis.call('HSETNX', published, ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('HINCRBY', run, 'inflight', 1)
    redis.call('HSET', KEYS[6], ARGV[i], 1)
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[i])
  end
end
if c.done then
  redis.call('HSET', run, 'sweep_done', 1, 'swept_at', ARGV[2])
  if finish(run, ARGV[2]) == 1 then return 'finished' end
end
return 'saved'
"""
)


# Staging is fenced like the checkpoint: KEYS[1] the stage, KEYS[2] the sweep lease;
# ARGV[1] the fence.  _STAGE_LUA appends ARGV[2..]; _KEEP_STAGED_LUA keeps ARGV[2] batches.
_STAGE_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
for i = 2, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
return redis.call('LLEN', KEYS[1])
"""

_KEEP_STAGED_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local keep = tonumber(ARGV[2])
if keep <= 0 then redis.call('DEL', KEYS[1]) else redis.call('LTRIM', KEYS[1], 0, keep - 1) end
return 0
"""


class StageFenced(Exception):
    """Control flow: the slice that staged or trimmed no longer holds the sweep lease."""


class SweepState(Keyspace):
    """The sweep's part of a run's state; every counting write is an atomic script."""

    def __init__(self, client: redis.Redis, prefix: str = "dc") -> None:
        super().__init__(client, prefix)
        self._checkpoint = client.register_script(_CHECKPOINT_LUA)
        self._stage = client.register_script(_STAGE_LUA)
        self._keep_staged = client.register_script(_KEEP_STAGED_LUA)

    def take_lease(self, run_id: str, seconds: float) -> str | None:
        """Take the sweep lease of ``run_id`` for ``seconds``; its fence, or None.

        Only the holder's checkpoints are written (see :meth:`save_checkpoint`), so a
        slice that outran its lease and overlaps a redelivered one cannot count the
        same batches twice.  The lease is a redis-py lock whose token is the fence:
        the checkpoint script reads the same key and compares the same value.
        """
        fence = uuid.uuid4().hex
        lease = self.lock(self.run_key(run_id, "sweep_lease"), fence, seconds)
        return fence if lease.acquire(token=fence) else None

    def holds_lease(self, run_id: str, token: str) -> bool:
        """True while the fence ``token`` still holds the sweep lease of ``run_id``."""
        return self.lock(self.run_key(run_id, "sweep_lease"), token).owned()

    def release_lease(self, run_id: str, token: str) -> None:
        """Give the lease back, if the fence ``token`` still holds it."""
        release(self.lock(self.run_key(run_id, "sweep_lease"), token))

    def save_checkpoint(
        self,
        run_id: str,
        checkpoint: Mapping[str, Any],
        new_batches: Mapping[str, bytes],
        *,
        lease: str,
        lease_seconds: float,
    ) -> str:
        """Store the sweep checkpoint and the sweep-owned counters in one step.

        ``new_batches`` maps the batch ids entering flight for the first time to
        their published digests; they are counted in ``inflight`` exactly once, even
        when the sweep resumes and publishes its outbox again, and each keeps the
        digest it was first published with.  Only the holder of ``lease`` writes, renewing it
        for ``lease_seconds``; any other caller gets ``fenced`` and changes nothing.
        A checkpoint is progress, so it also clears the sweep's error count.
        """
        result = self._checkpoint(
            keys=[
                self.run_key(run_id),
                self.run_key(run_id, "checkpoint"),
                self.run_key(run_id, "pending"),
                self.run_key(run_id, "sweep_lease"),
                self.run_key(run_id, "published"),
                self.run_key(run_id, "chains"),
            ],
            args=[
                json.dumps(checkpoint),
                now_iso(),
                time.time(),
                len(new_batches),
                lease,
                int(lease_seconds * 1000),
                *(part for pair in new_batches.items() for part in pair),
            ],
        )
        return as_text(result)

    def count_sweep_error(self, run_id: str) -> int:
        """Count one failed sweep slice since the last checkpoint; returns the count."""
        return int(self.redis.hincrby(self.run_key(run_id), "sweep_errors", 1))

    def stage(self, run_id: str, batches: Sequence[Sequence[Any]], *, lease: str) -> int:
        """Append batches of expired keys to the run's staged list; returns its length.

        The guard pass stages what it counted, so publishing reads the batches back
        instead of listing the target a second time (see :mod:`digest_cleanup.pipeline.sweep`).
        Only the holder of the sweep lease ``lease`` appends; any other slice raises
        :class:`StageFenced` having appended nothing, so no key is staged twice.
        """
        keys = [self.run_key(run_id, "staged"), self.run_key(run_id, "sweep_lease")]
        result = int(self._stage(keys=keys, args=[lease, *(json.dumps(list(b)) for b in batches)]))
        if result < 0:
            raise StageFenced(run_id)
        return result

    def staged(self, run_id: str, start: int, count: int) -> list[list[Any]]:
        """Up to ``count`` staged batches from index ``start`` on, in the order staged."""
        raw = self.redis.lrange(self.run_key(run_id, "staged"), start, start + count - 1)
        return [list(json.loads(batch)) for batch in raw]

    def keep_staged(self, run_id: str, batches: int, *, lease: str) -> None:
        """Keep the first ``batches`` staged batches and drop the rest (all of them for 0).

        A guard slice that dies after staging a batch but before its checkpoint
        leaves that batch behind; the next slice lists its keys again from the
        checkpoint's cursor, so it drops the leftover first.  Fenced like
        :meth:`stage`: only the holder of ``lease`` trims.
        """
        keys = [self.run_key(run_id, "staged"), self.run_key(run_id, "sweep_lease")]
        if int(self._keep_staged(keys=keys, args=[lease, batches])) < 0:
            raise StageFenced(run_id)

    def published_digest(self, run_id: str, batch_id: str) -> bytes | None:
        """What the sweep published for ``batch_id`` (its entries' digests), or None."""
        raw = self.redis.hget(self.run_key(run_id, "published"), batch_id)
        if raw is None:
            return None
        # The store's client never decodes replies; a str here would be a misconfiguration.
        return raw if isinstance(raw, bytes) else raw.encode("latin-1")

    def load_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        raw = self.redis.get(self.run_key(run_id, "checkpoint"))
        return None if raw is None else dict(json.loads(raw))
