"""The sweep: stream a target's listing and fan expired items out as batches.

A sweep runs in *slices* of at most :data:`SLICE_SECONDS` (or a third of the
visibility timeout), each one a short task that re-enqueues the next.  No task
outlives the visibility timeout, a killed sweep resumes from its checkpoint,
and a lease keeps two copies of a slice from sweeping at once.

Per page the sweep writes a checkpoint *before* publishing: the cursor, the
counters, the expired items not yet in a batch, and an *outbox* of the batches
about to be published.  A resumed slice publishes the outbox again; batch ids
are deterministic and attempts are claimed once, so a batch published twice is
deleted harmlessly and counted once, and none is ever lost.

Before it publishes anything, the sweep counts expired items (the *guard pass*)
and refuses a run past the target's ``max_delete``: such a run deletes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from digest_cleanup.batches import BatchPayload, backoff, batch_id
from digest_cleanup.errors import ItemError, PermanentError
from digest_cleanup.kinds import TargetKind
from digest_cleanup.logs import log_event
from digest_cleanup.reports import finish_run
from digest_cleanup.runs import epoch_of, now_iso
from digest_cleanup.runtime import Runtime
from digest_cleanup.targets import Target

logger = logging.getLogger("digest_cleanup.sweep")

#: Longest a sweep slice runs before handing over to the next one.
SLICE_SECONDS = 30.0
#: Expired items a dry run shows as a sample.
SAMPLE_SIZE = 20

SliceResult = Literal["continue", "done", "attached", "failed", "missing"]
Publish = Callable[[BatchPayload], None]


@dataclasses.dataclass
class Checkpoint:
    """Where a sweep is; stored as JSON after every page."""

    phase: Literal["guard", "publish"] = "guard"
    cursor: str | None = None
    seq: int = 0
    listed: int = 0
    expired: int = 0
    pending: list[str] = dataclasses.field(default_factory=list)
    outbox: list[list[Any]] = dataclasses.field(default_factory=list)
    sample: list[str] = dataclasses.field(default_factory=list)
    done: bool = False
    #: The guard pass's own counts; the run's counters stay at zero until publishing.
    guard_listed: int = 0
    guard_expired: int = 0
    #: The run incarnation's token, stamped on every batch (see ``runs.RunStore.open``).
    run_token: str = ""


def run_id_for(target: str, cutoff: datetime, *, dry_run: bool = False) -> str:
    """Deterministic: the same target and cutoff always name the same run."""
    return f"{target}-{cutoff:%Y%m%dT%H%M%SZ}" + ("-dry" if dry_run else "")


def sweep_slice(
    runtime: Runtime, run_id: str, publish: Publish, *, slice_seconds: float | None = None
) -> SliceResult:
    """Advance the sweep of ``run_id`` by one slice; ``continue`` means enqueue the next."""
    store = runtime.store
    run = store.find(run_id)
    if run is None:
        return "missing"
    if run.finished or run.fields.get("sweep_done") == "1":
        return "done"
    limit = slice_seconds or min(SLICE_SECONDS, runtime.settings.visibility_timeout / 3)
    lease_key = store.run_key(run_id, "sweep_lease")
    token = uuid.uuid4().hex
    # The lease outlives a slice a little, so a live slice is never overlapped,
    # and a dead one frees the sweep well before its message is redelivered.
    if not store.redis.set(lease_key, token, nx=True, px=int((limit + 10) * 1000)):
        return "attached"
    try:
        target = runtime.target(run["target"])
        kind = runtime.kind(target.name)
        cutoff = datetime.fromisoformat(run["cutoff"])
        raw = store.load_checkpoint(run_id)
        cp = Checkpoint(**raw) if raw else Checkpoint(run_token=run.fields.get("token", ""))
        forced = run.fields.get("forced") == "1"
        dry_run = run.fields.get("dry_run") == "1"
        deadline = time.monotonic() + limit
        if cp.phase == "guard":
            if not _guard(runtime, run_id, target, kind, cutoff, cp, deadline, forced, dry_run):
                return "failed" if store.get(run_id).finished else "continue"
            if dry_run:
                return "done"
        return _publish(runtime, run_id, target, kind, cutoff, cp, deadline, publish)
    finally:
        release = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end"
        store.redis.eval(release, 1, lease_key, token)


def _guard(
    runtime: Runtime,
    run_id: str,
    target: Target,
    kind: TargetKind,
    cutoff: datetime,
    cp: Checkpoint,
    deadline: float,
    forced: bool,
    dry_run: bool,
) -> bool:
    """Count expired items before anything is deleted; True once the guard has passed."""
    store = runtime.store
    limit = None if (forced or dry_run) else target.max_delete
    for page in kind.scan(cutoff, start_after=cp.cursor):
        cp.guard_listed += page.scanned
        cp.guard_expired += len(page.expired)
        if dry_run and len(cp.sample) < SAMPLE_SIZE:
            cp.sample.extend(page.expired[: SAMPLE_SIZE - len(cp.sample)])
        if page.cursor is not None:
            cp.cursor = page.cursor
        if limit is not None and cp.guard_expired > limit:
            message = (
                f"more than {limit} expired items (max_delete for target {target.name}); nothing "
                f"was deleted. If this is expected, raise max_delete in the targets file or run "
                f"'digest-cleanup run {target.name} --cutoff {cutoff.isoformat()} --force'"
            )
            store.update(run_id, listed=cp.guard_listed, expired_seen=cp.guard_expired)
            store.fail(run_id, "max_delete_exceeded", message)
            finish_run(runtime, run_id)
            return False
        if time.monotonic() > deadline:
            store.save_checkpoint(run_id, dataclasses.asdict(cp), [])
            return False
    if dry_run:
        store.update(
            run_id,
            listed=cp.guard_listed,
            expired=cp.guard_expired,
            sample=cp.sample,
            sweep_done=1,
            status="complete",
            ended_at=now_iso(),
        )
        finish_run(runtime, run_id)
        return True
    log_event(
        logger,
        "guard",
        runtime.settings,
        run_id=run_id,
        expired=cp.guard_expired,
        max_delete=target.max_delete,
        forced=forced,
    )
    cp.phase, cp.cursor = "publish", None
    # The guard's count is the best estimate of the run's size while it streams.
    store.update(run_id, expired_seen=cp.guard_expired)
    store.save_checkpoint(run_id, dataclasses.asdict(cp), [])
    return True


def _publish(
    runtime: Runtime,
    run_id: str,
    target: Target,
    kind: TargetKind,
    cutoff: datetime,
    cp: Checkpoint,
    deadline: float,
    publish: Publish,
) -> SliceResult:
    if cp.outbox:  # batches a crashed slice may not have sent
        for seq, items in cp.outbox:
            publish(_payload(run_id, target, cutoff, seq, items, cp.run_token))
        # Sent: a slice that now fails listing (and is retried) must not send them again.
        cp.outbox = []
        runtime.store.save_checkpoint(run_id, dataclasses.asdict(cp), [])
    for page in kind.scan(cutoff, start_after=cp.cursor):
        cp.listed += page.scanned
        cp.expired += len(page.expired)
        cp.pending.extend(page.expired)
        if page.cursor is not None:
            cp.cursor = page.cursor
        _emit(runtime, run_id, target, cutoff, cp, publish, final=False)
        if time.monotonic() > deadline:
            # Handing over cleanly: the outbox went out, so the next slice must not resend it.
            cp.outbox = []
            runtime.store.save_checkpoint(run_id, dataclasses.asdict(cp), [])
            return "continue"
    cp.done = True
    result = _emit(runtime, run_id, target, cutoff, cp, publish, final=True)
    log_event(
        logger,
        "sweep",
        runtime.settings,
        run_id=run_id,
        listed=cp.listed,
        expired=cp.expired,
        batches=cp.seq,
    )
    if result == "finished":
        finish_run(runtime, run_id)
    return "done"


def _emit(
    runtime: Runtime,
    run_id: str,
    target: Target,
    cutoff: datetime,
    cp: Checkpoint,
    publish: Publish,
    *,
    final: bool,
) -> str:
    """Cut full batches from the pending items, checkpoint them, then publish them."""
    outbox: list[list[Any]] = []
    while len(cp.pending) >= target.batch_size or (final and cp.pending):
        items, cp.pending = cp.pending[: target.batch_size], cp.pending[target.batch_size :]
        cp.seq += 1
        outbox.append([cp.seq, items])
    cp.outbox = outbox
    result = runtime.store.save_checkpoint(
        run_id, dataclasses.asdict(cp), [batch_id(run_id, seq) for seq, _ in outbox]
    )
    for seq, items in outbox:
        publish(_payload(run_id, target, cutoff, seq, items, cp.run_token))
    return result


def _payload(
    run_id: str, target: Target, cutoff: datetime, seq: int, items: list[str], run_token: str
) -> BatchPayload:
    return BatchPayload(
        run_id=run_id,
        run_token=run_token,
        target=target.name,
        batch_id=batch_id(run_id, seq),
        seq=seq,
        cutoff=cutoff.isoformat(),
        items=items,
        published_at=time.time(),
    )


@dataclasses.dataclass(frozen=True)
class Started:
    """What a trigger did: created, attached, resumed (a stalled sweep) or restarted."""

    run_id: str
    action: Literal["created", "attached", "resumed", "restarted"]
    status: str


def start(
    runtime: Runtime,
    target: Target,
    cutoff: datetime,
    enqueue: Callable[[str], None],
    *,
    dry_run: bool = False,
    force: bool = False,
    trigger: str = "cli",
) -> Started:
    """Open the run for (target, cutoff) and enqueue its sweep, unless it already exists.

    A second trigger for a run in progress attaches to it (beat firing twice, an
    operator re-running).  A run whose sweep stopped making progress for longer
    than the visibility timeout gets its sweep enqueued again: it resumes from
    the checkpoint.  A ``failed`` run starts over, since nothing it refused was deleted.
    """
    store = runtime.store
    run_id = run_id_for(target.name, cutoff, dry_run=dry_run)
    fields = {
        "target": target.name,
        "kind": target.kind,
        "location": target.make_kind(runtime.settings).describe(),
        "cutoff": cutoff.isoformat(),
        "dry_run": dry_run,
        "forced": force,
        "trigger": trigger,
        "batch_size": target.batch_size,
        "max_delete": target.max_delete,
        "config_digest": target.config_digest,
    }
    status = store.open(run_id, fields)
    if status == "failed":
        store.reset(run_id)
        status = store.open(run_id, fields)
        action: Literal["created", "attached", "resumed", "restarted"] = "restarted"
    else:
        action = "created" if status == "created" else "attached"
    if action in ("created", "restarted"):
        log_event(
            logger,
            "run",
            runtime.settings,
            run_id=run_id,
            status="running",
            trigger=trigger,
            action=action,
            cutoff=cutoff.isoformat(),
            dry_run=dry_run,
        )
        enqueue(run_id)
        return Started(run_id, action, "running")
    run = store.get(run_id)
    if (
        run.status == "running"
        and run.fields.get("sweep_done") != "1"
        and _stalled(runtime, run.fields)
    ):
        enqueue(run_id)
        return Started(run_id, "resumed", run.status)
    return Started(run_id, "attached", run.status)


def _stalled(runtime: Runtime, fields: Any) -> bool:
    """True when the sweep has not checkpointed for longer than a redelivery would take."""
    last = epoch_of(fields.get("sweep_heartbeat") or fields.get("created_at"))
    if last is None:
        return True
    return time.time() - last > runtime.settings.visibility_timeout + SLICE_SECONDS


def on_slice_error(runtime: Runtime, run_id: str, exc: Exception) -> float | None:
    """Decide what a failed sweep slice does: seconds until the slice is retried, or None.

    A permanent listing error (no such bucket, access denied on ListBucket) fails the
    run at once with ``listing_failed``; nothing has been deleted that should not have
    been, and the message says what to fix.  Anything else is retried with the same
    backoff as batches, and fails the run once the retry budget is spent.
    """
    store = runtime.store
    settings = runtime.settings
    if isinstance(exc, ItemError):
        detail = f"{exc.code}: {exc.message}"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, PermanentError):
        errors = store.redis.hincrby(store.run_key(run_id), "sweep_errors", 1)
        if errors <= settings.max_retries:
            retry_after = exc.retry_after if isinstance(exc, ItemError) else None
            countdown = backoff(errors - 1, settings, retry_after)
            log_event(
                logger,
                "sweep",
                settings,
                level=logging.WARNING,
                run_id=run_id,
                error=detail,
                retry_in=round(countdown, 2),
                attempt=errors,
            )
            return countdown
    store.fail(run_id, "listing_failed", f"listing the target failed: {detail}")
    finish_run(runtime, run_id)
    return None
