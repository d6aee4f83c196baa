"""The two phases of a sweep slice: the guard pass, then publishing from the stage.

:mod:`digest_cleanup.pipeline.sweep` runs a slice; this module is what a slice
does.  The guard pass counts (and stages) the expired keys; publishing drains
the stage, refilling it from a second listing when the run was too big to stage
whole.  Every step checkpoints (:mod:`~digest_cleanup.model.checkpoint`)
through the run store, which fences off a slice that lost its lease.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime
from typing import Any, Literal

from digest_cleanup.clock import now_iso
from digest_cleanup.errors import RunStateError
from digest_cleanup.kinds import Page, TargetKind
from digest_cleanup.logs import log_event
from digest_cleanup.model.batches import BatchPayload, batch_id, entry_digests
from digest_cleanup.model.checkpoint import Checkpoint, Expired, Stage
from digest_cleanup.pipeline.batch_groups import cut_batches
from digest_cleanup.pipeline.lifecycle import finish_run
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.store.runs import RunStore
from digest_cleanup.store.sweeps import StageFenced
from digest_cleanup.targets import Target

logger = logging.getLogger("digest_cleanup.sweep")

#: Expired keys a dry run shows as a sample.
SAMPLE_SIZE = 20
#: Most expired keys the guard pass stages in Redis (about 100 bytes each there,
#: with its ETag).  Only a forced run, or a max_delete raised past it, stages more;
#: such a run refills the stage from a second listing, :data:`REFILL_BATCHES` at a time.
STAGE_LIMIT = 1_000_000
#: Batches a second listing stages before they are drained.
REFILL_BATCHES = 64
#: Staged batches read from Redis, checkpointed and sent at a time.
STAGED_READ_BATCHES = 16

SliceResult = Literal["continue", "done", "attached", "failed", "missing", "fenced"]


class Fenced(Exception):
    """Control flow, not an error: a slice outran its lease and another took over.

    The slice stops at once, having written nothing since it lost the lease.
    """


@dataclasses.dataclass
class Slice:
    """What one sweep slice works with, and its checkpoint."""

    runtime: Runtime
    run_id: str
    target: Target
    kind: TargetKind
    cutoff: datetime
    cp: Checkpoint
    deadline: float
    forced: bool
    dry_run: bool
    #: The sweep lease's fencing token, and how long each checkpoint renews it for.
    lease: str
    lease_seconds: float

    @property
    def store(self) -> RunStore:
        return self.runtime.store

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def send(self, seq: int, entries: list[Any]) -> None:
        self.runtime.dispatcher.send_batch(_payload(self, seq, entries))

    def stage(self, batches: list[list[Any]]) -> int:
        """Append batches to the run's stage; raise :class:`Fenced` if the lease is lost."""
        try:
            return self.store.sweeps.stage(self.run_id, batches, lease=self.lease)
        except StageFenced:
            raise Fenced(self.run_id) from None

    def keep_staged(self, batches: int) -> None:
        """Trim the run's stage to ``batches``; raise :class:`Fenced` if the lease is lost."""
        try:
            self.store.sweeps.keep_staged(self.run_id, batches, lease=self.lease)
        except StageFenced:
            raise Fenced(self.run_id) from None

    def save(self, new_batches: dict[str, bytes] | None = None) -> str:
        """Checkpoint; raise :class:`Fenced` if another slice holds the lease now.

        ``new_batches`` maps the batch ids this checkpoint puts in flight to their
        published digests (:func:`~digest_cleanup.model.batches.entry_digests`).
        """
        result = self.store.sweeps.save_checkpoint(
            self.run_id,
            self.cp.to_stored(),
            new_batches or {},
            lease=self.lease,
            lease_seconds=self.lease_seconds,
        )
        if result == "fenced":
            log_event(logger, "sweep", self.runtime.settings, level=logging.WARNING,
                      run_id=self.run_id, result="fenced")  # fmt: skip
            raise Fenced(self.run_id)
        return result


def guard_pass(sweep: Slice) -> bool:
    """Count expired keys before anything is deleted; True once the guard has passed.

    Unless this is a dry run, the expired keys are also staged as the pages
    arrive, so that publishing drains the stage instead of listing the target a
    second time.  Past :data:`STAGE_LIMIT` keys (only a forced or very large run)
    the stage is dropped, and publishing fills it again from a second listing.
    """
    store, cp, target, run_id = sweep.store, sweep.cp, sweep.target, sweep.run_id
    guard, stage = cp.guard, cp.stage
    limit = None if (sweep.forced or sweep.dry_run) else target.max_delete
    staging = guard.staging and not sweep.dry_run
    for page in sweep.kind.scan(sweep.cutoff, start_after=guard.cursor):
        guard.listed += page.scanned
        guard.expired += len(page.expired)
        if sweep.dry_run and len(guard.sample) < SAMPLE_SIZE:
            guard.sample.extend(page.expired[: SAMPLE_SIZE - len(guard.sample)])
        if page.cursor is not None:
            guard.cursor = page.cursor
        if limit is not None and guard.expired > limit:
            return _refuse_max_delete(sweep, limit)
        if staging and guard.expired > STAGE_LIMIT:
            # Checkpointed first, so a slice that dies here never resumes counting on
            # batches that are no longer staged.
            cp.stage = stage = Stage()
            guard.staging = staging = False
            sweep.save()
            sweep.keep_staged(0)
        elif staging:
            stage.cursor = guard.cursor
            stage.unbatched.extend(_expired(page))
            _stage(sweep, final=False)
        if sweep.out_of_time():
            sweep.save()
            return False
    if sweep.dry_run:
        store.runs.update(run_id, listed=guard.listed, expired=guard.expired, sample=guard.sample,
                     sweep_done=1, status="complete", ended_at=now_iso())  # fmt: skip
        finish_run(sweep.runtime, run_id)
        return True
    if staging:  # publishing drains the stage: everything was listed already
        _stage(sweep, final=True)
        stage.complete = True
        cp.publishing.listed = guard.listed
    else:
        cp.stage = Stage()  # the second listing starts from the beginning
    log_event(logger, "guard", sweep.runtime.settings, run_id=run_id, expired=guard.expired,
              max_delete=target.max_delete, forced=sweep.forced, staged=staging)  # fmt: skip
    cp.phase = "publish"
    # The guard's count is the best estimate of the run's size while it streams.
    store.runs.update(run_id, expired_seen=guard.expired)
    sweep.save()
    return True


def _refuse_max_delete(sweep: Slice, limit: int) -> bool:
    """Fail a run with more expired keys than ``max_delete``; nothing was deleted."""
    guard, store, run_id = sweep.cp.guard, sweep.store, sweep.run_id
    message = (
        f"more than {limit} expired keys (max_delete for target {sweep.target.name}); nothing "
        f"was deleted. If this is expected, raise max_delete in the targets file or run "
        f"'digest-cleanup run {sweep.target.name} --cutoff {sweep.cutoff.isoformat()} --force'"
    )
    sweep.keep_staged(0)
    store.runs.update(run_id, listed=guard.listed, expired_seen=guard.expired)
    store.runs.fail(run_id, "max_delete_exceeded", message)
    finish_run(sweep.runtime, run_id)
    return False


def _stage(sweep: Slice, *, final: bool) -> None:
    """Stage the full batches in the unbatched keys (and the rest too when ``final``)."""
    stage = sweep.cp.stage
    batches, stage.unbatched = cut_batches(
        stage.unbatched, sweep.target.batch_size, sweep.kind, final=final
    )
    if batches:
        stage.staged = sweep.stage(batches)


def _expired(page: Page) -> list[Expired]:
    conditions = page.conditions or [""] * len(page.expired)
    return [[key, condition] for key, condition in zip(page.expired, conditions, strict=True)]


def publish(sweep: Slice) -> SliceResult:
    """Drain the stage; refill it from a second listing while keys remain unstaged."""
    stage = sweep.cp.stage
    while True:
        if not _drain(sweep):
            return "continue"
        if stage.complete:
            break
        # Every staged batch is out: start the next window where the listing got to.
        # Checkpointed before the stage is emptied, so a slice that dies from here on
        # resumes with nothing left to resend from it: resending reads the stage, and
        # the next window's batches would be read in place of this one's.
        stage.base, stage.staged = stage.base + stage.staged, 0
        sweep.save()
        sweep.keep_staged(0)
        if not _refill(sweep):
            return "continue"
    result = _done(sweep)
    sweep.keep_staged(0)  # every batch is out: free the memory now
    return result


def _drain(sweep: Slice) -> bool:
    """Send the staged batches, :data:`STAGED_READ_BATCHES` per checkpoint; False if out of time.

    A checkpoint counts a chunk of batches in flight (``seq``) *before* they are
    sent; ``sent`` catches up after, so a slice that died in between sends that
    chunk again.
    """
    pub, stage, run_id = sweep.cp.publishing, sweep.cp.stage, sweep.run_id
    if pub.sent < pub.seq:  # batches a crashed slice may not have sent
        for offset, entries in enumerate(_read_staged(sweep, pub.sent, pub.seq - pub.sent)):
            sweep.send(pub.sent + offset + 1, entries)
        pub.sent = pub.seq
    end = stage.base + stage.staged
    while pub.seq < end:
        first = pub.seq
        chunk = _read_staged(sweep, first, STAGED_READ_BATCHES)
        pub.seq = first + len(chunk)
        pub.expired += sum(len(entries) for entries in chunk)
        token = sweep.cp.run_token
        sweep.save(
            {
                batch_id(run_id, first + offset + 1): entry_digests(
                    token, [key for key, _ in entries], [cond for _, cond in entries]
                )
                for offset, entries in enumerate(chunk)
            }
        )
        for offset, entries in enumerate(chunk):
            sweep.send(first + offset + 1, entries)
        pub.sent = pub.seq
        if pub.seq < end and sweep.out_of_time():
            sweep.save()
            return False
    return True


def _refill(sweep: Slice) -> bool:
    """Stage up to :data:`REFILL_BATCHES` from the second listing; False if out of time."""
    stage, pub = sweep.cp.stage, sweep.cp.publishing
    for page in sweep.kind.scan(sweep.cutoff, start_after=stage.cursor):
        pub.listed += page.scanned
        stage.unbatched.extend(_expired(page))
        if page.cursor is not None:
            stage.cursor = page.cursor
        _stage(sweep, final=False)
        if stage.staged >= REFILL_BATCHES or sweep.out_of_time():
            sweep.save()
            return not sweep.out_of_time()
    _stage(sweep, final=True)
    stage.complete = True
    sweep.save()
    return True


def _read_staged(sweep: Slice, first: int, count: int) -> list[list[Any]]:
    """Up to ``count`` staged batches from batch ``first + 1`` on."""
    stage = sweep.cp.stage
    start = first - stage.base
    chunk = sweep.store.sweeps.staged(sweep.run_id, start, min(count, stage.staged - start))
    if not chunk and not sweep.store.sweeps.holds_lease(sweep.run_id, sweep.lease):
        raise Fenced(sweep.run_id)  # a slice that took over finished and freed them
    if not chunk:
        raise RunStateError(
            f"run {sweep.run_id}: {stage.staged - start} staged batches are missing from "
            "Redis (evicted? the broker's Redis needs maxmemory-policy noeviction); the "
            "keys they held are still in S3: trigger the run again to sweep it from the listing"
        )
    return chunk


def _done(sweep: Slice) -> SliceResult:
    """Mark the sweep done, only after its last batches went out.

    A sweep marked done is never resumed, so a slice that died between marking
    it and sending would leave batches in flight that nobody sends.
    """
    pub = sweep.cp.publishing
    pub.done = True
    result = sweep.save()
    log_event(logger, "sweep", sweep.runtime.settings, run_id=sweep.run_id, listed=pub.listed,
              expired=pub.expired, batches=pub.seq)  # fmt: skip
    if result == "finished":
        finish_run(sweep.runtime, sweep.run_id)
    return "done"


def _payload(sweep: Slice, seq: int, entries: list[Any]) -> BatchPayload:
    conditions = [condition for _, condition in entries]
    return BatchPayload(
        run_id=sweep.run_id,
        run_token=sweep.cp.run_token,
        target=sweep.target.name,
        batch_id=batch_id(sweep.run_id, seq),
        seq=seq,
        cutoff=sweep.cutoff.isoformat(),
        keys=[key for key, _ in entries],
        conditions=conditions if any(conditions) else [],
        scope=sweep.kind.scope_digest,
        published_at=time.time(),
    )
