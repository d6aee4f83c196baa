"""A run's sweep state in Redis: the sweep lease, the checkpoint and the staged batches.

One slice at a time sweeps a run: it holds the lease, and its checkpoint, which
only the lease's holder can write, saves how far the listing got together with
its counts in the run (see :mod:`digest_cleanup.pipeline.sweep`).  The
stage is fenced the same way: a slice that lost the lease appends and trims
nothing.  The checkpoint that puts a batch in flight also keeps the batch's
*published digest* (:func:`~digest_cleanup.model.batches.entry_digests`): what
a worker may delete for that batch id, whatever a message says.

:class:`Sweeps` owns a run's ``checkpoint``, ``sweep_lease``, ``staged`` and
``published`` keys; what a checkpoint changes in the run goes through the run
part's fragment ``run_sweep.lua``, in the same script.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.client import Pipeline

from digest_cleanup.clock import now_iso
from digest_cleanup.model.batches import BatchPayload, unpublished_keys
from digest_cleanup.store.connection import as_text, release, token_lock
from digest_cleanup.store.keys import RUN_TTL_SECONDS, SWEEP_SUFFIXES, Keys
from digest_cleanup.store.scripts import Script


class StageFenced(Exception):
    """Control flow: the slice that staged or trimmed no longer holds the sweep lease."""


class Sweeps:
    """The sweep's part of a run's state; every counting write is an atomic script."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._checkpoint = Script(client, "sweep_checkpoint.lua")
        self._stage = Script(client, "sweep_stage.lua")
        self._keep_staged = Script(client, "sweep_keep_staged.lua")

    def take_lease(self, run_id: str, seconds: float) -> str | None:
        """Take the sweep lease of ``run_id`` for ``seconds``; its fence, or None.

        Only the holder's checkpoints are written (see :meth:`save_checkpoint`), so a
        slice that outran its lease and overlaps a redelivered one cannot count the
        same batches twice.  The lease is a redis-py lock whose token is the fence:
        the checkpoint script reads the same key and compares the same value.
        """
        fence = uuid.uuid4().hex
        lease = token_lock(self.client, self.keys.sweep_lease(run_id), fence, seconds)
        return fence if lease.acquire(token=fence) else None

    def holds_lease(self, run_id: str, token: str) -> bool:
        """True while the fence ``token`` still holds the sweep lease of ``run_id``."""
        return token_lock(self.client, self.keys.sweep_lease(run_id), token).owned()

    def release_lease(self, run_id: str, token: str) -> None:
        """Give the lease back, if the fence ``token`` still holds it."""
        release(token_lock(self.client, self.keys.sweep_lease(run_id), token))

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
            keys={
                "run": self.keys.run(run_id),
                "checkpoint": self.keys.run(run_id, "checkpoint"),
                "pending": self.keys.run(run_id, "pending"),
                "lease": self.keys.sweep_lease(run_id),
                "published": self.keys.run(run_id, "published"),
                "chains": self.keys.run(run_id, "chains"),
            },
            args={
                "state": json.dumps(checkpoint),
                "now": now_iso(),
                "now_epoch": time.time(),
                "fence": lease,
                "lease_ms": int(lease_seconds * 1000),
            },
            rest=[part for pair in new_batches.items() for part in pair],
        )
        return as_text(result)

    def stage(self, run_id: str, batches: Sequence[Sequence[Any]], *, lease: str) -> int:
        """Append batches of expired keys to the run's staged list; returns its length.

        The guard pass stages what it counted, so publishing reads the batches back
        instead of listing the target a second time (see :mod:`digest_cleanup.pipeline.sweep`).
        Only the holder of the sweep lease ``lease`` appends; any other slice raises
        :class:`StageFenced` having appended nothing, so no key is staged twice.
        """
        keys = {
            "staged": self.keys.run(run_id, "staged"),
            "lease": self.keys.sweep_lease(run_id),
        }
        staged = [json.dumps(list(b)) for b in batches]
        result = int(self._stage(keys=keys, args={"fence": lease}, rest=staged))
        if result < 0:
            raise StageFenced(run_id)
        return result

    def staged(self, run_id: str, start: int, count: int) -> list[list[Any]]:
        """Up to ``count`` staged batches from index ``start`` on, in the order staged."""
        raw = self.client.lrange(self.keys.run(run_id, "staged"), start, start + count - 1)
        return [list(json.loads(batch)) for batch in raw]

    def keep_staged(self, run_id: str, batches: int, *, lease: str) -> None:
        """Keep the first ``batches`` staged batches and drop the rest (all of them for 0).

        A guard slice that dies after staging a batch but before its checkpoint
        leaves that batch behind; the next slice lists its keys again from the
        checkpoint's cursor, so it drops the leftover first.  Fenced like
        :meth:`stage`: only the holder of ``lease`` trims.
        """
        keys = {
            "staged": self.keys.run(run_id, "staged"),
            "lease": self.keys.sweep_lease(run_id),
        }
        if int(self._keep_staged(keys=keys, args={"fence": lease, "keep": batches})) < 0:
            raise StageFenced(run_id)

    def published_digest(self, run_id: str, batch_id: str) -> bytes | None:
        """What the sweep published for ``batch_id`` (its entries' digests), or None."""
        raw = self.client.hget(self.keys.run(run_id, "published"), batch_id)
        if raw is None:
            return None
        # The store's client never decodes replies; a str here would be a misconfiguration.
        return raw if isinstance(raw, bytes) else raw.encode("latin-1")

    def is_published(self, payload: BatchPayload) -> bool:
        """True when the run published ``payload``'s batch with every key and condition."""
        published = self.published_digest(payload.run_id, payload.batch_id)
        return published is not None and not unpublished_keys(published, payload)

    def load_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        raw = self.client.get(self.keys.run(run_id, "checkpoint"))
        return None if raw is None else dict(json.loads(raw))

    def forget(self, run_id: str, pipe: Pipeline) -> None:
        """Add to ``pipe`` the deletion of the sweep part's keys of ``run_id``."""
        pipe.delete(*(self.keys.run(run_id, s) for s in SWEEP_SUFFIXES))

    def expire(self, run_id: str, pipe: Pipeline) -> None:
        """Add to ``pipe`` the expiry of the sweep part's keys of ``run_id``."""
        for suffix in SWEEP_SUFFIXES:
            pipe.expire(self.keys.run(run_id, suffix), RUN_TTL_SECONDS)
