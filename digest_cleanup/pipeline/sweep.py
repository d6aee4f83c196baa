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
The guard pass cuts the expired items into batches and *stages* them in Redis
as it counts them, so publishing reads them back instead of listing the target
a second time: the listing is paid for once, and the first batches go out as
soon as the guard has passed.  The staged batches live with the run's state; a
run whose state is lost (Redis restarted empty) is swept again from the listing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime
from typing import Any, Literal

from digest_cleanup.config.targets import Target
from digest_cleanup.errors import CutoffError, ItemError, PermanentError, RunStateError
from digest_cleanup.kinds import Page, TargetKind
from digest_cleanup.logs import log_event
from digest_cleanup.pipeline.batches import BatchPayload, backoff, batch_id
from digest_cleanup.pipeline.lifecycle import finish_run
from digest_cleanup.pipeline.runs import FINAL_STATUSES, RunStore, epoch_of, now_iso
from digest_cleanup.pipeline.runtime import Runtime

logger = logging.getLogger("digest_cleanup.sweep")

#: Longest a sweep slice runs before handing over to the next one.
SLICE_SECONDS = 30.0
#: Expired items a dry run shows as a sample.
SAMPLE_SIZE = 20
#: Most expired items the guard pass stages in Redis for publishing (about 100 bytes
#: each there, with its ETag).  Only a forced run, or a max_delete raised past it, stages more;
#: such a run lists its target a second time to publish instead.
STAGE_LIMIT = 1_000_000
#: Staged batches read from Redis, checkpointed and published at a time.
STAGED_READ_BATCHES = 16

#: How much longer than a slice its lease lasts, so a live slice is never overlapped.
LEASE_MARGIN_SECONDS = 10.0

SliceResult = Literal["continue", "done", "attached", "failed", "missing", "fenced"]
#: An expired item with its delete condition, as the checkpoint and staging keep it.
Expired = list[str]


class Fenced(Exception):
    """Control flow, not an error: a slice outran its lease and another took over.

    The slice stops at once, having written nothing since it lost the lease.
    """


@dataclasses.dataclass
class Checkpoint:
    """Where a sweep is; stored as JSON after every page."""

    phase: Literal["guard", "publish"] = "guard"
    cursor: str | None = None
    seq: int = 0
    listed: int = 0
    expired: int = 0
    #: Expired items not yet in a batch, each as ``[item, condition]``.
    pending: list[Expired] = dataclasses.field(default_factory=list)
    outbox: list[list[Any]] = dataclasses.field(default_factory=list)
    sample: list[str] = dataclasses.field(default_factory=list)
    done: bool = False
    #: The guard pass's own counts; the run's counters stay at zero until publishing.
    guard_listed: int = 0
    guard_expired: int = 0
    #: The run incarnation's token, stamped on every batch (see ``runs.RunStore.open``).
    run_token: str = ""
    #: Batches the guard pass staged in Redis; -1 once staging stopped (past
    #: :data:`STAGE_LIMIT`), and publishing lists the target again.  Staged batch
    #: ``n`` is published as sequence number ``n + 1``, so ``seq`` staged batches
    #: are counted in flight.
    staged: int = 0
    #: Staged batches known to be published (``seq`` once a chunk has gone out).
    sent: int = 0


def run_id_for(target: str, cutoff: datetime, *, dry_run: bool = False) -> str:
    """Deterministic: the same target and cutoff always name the same run."""
    return f"{target}-{cutoff:%Y%m%dT%H%M%SZ}" + ("-dry" if dry_run else "")


def sweep_slice(
    runtime: Runtime, run_id: str, *, slice_seconds: float | None = None
) -> SliceResult:
    """Advance the sweep of ``run_id`` by one slice; ``continue`` means enqueue the next."""
    store = runtime.store
    run = store.find(run_id)
    if run is None:
        return "missing"
    if run.finished or run.fields.get("sweep_done") == "1":
        return "done"
    limit = slice_seconds or min(SLICE_SECONDS, runtime.settings.visibility_timeout / 3)
    # The lease outlives a slice a little, so a live slice is never overlapped, and a
    # dead one frees the sweep well before its message is redelivered.  Every
    # checkpoint renews it, and a slice that lost it is fenced off (see RunStore).
    lease_seconds = limit + LEASE_MARGIN_SECONDS
    token = store.take_lease(run_id, lease_seconds)
    if token is None:
        return "attached"
    try:
        target = runtime.target(run["target"])
        kind = runtime.kind(target.name)
        cutoff = datetime.fromisoformat(run["cutoff"])
        refusal = _refusal(target, kind, cutoff, run.fields.get("scope", ""))
        if refusal is not None:
            store.fail(run_id, *refusal)
            finish_run(runtime, run_id)
            return "failed"
        raw = store.load_checkpoint(run_id)
        sweep = _Slice(
            runtime=runtime,
            run_id=run_id,
            target=target,
            kind=kind,
            cutoff=cutoff,
            cp=_checkpoint(raw, run.fields.get("token", "")),
            deadline=time.monotonic() + limit,
            forced=run.fields.get("forced") == "1",
            dry_run=run.fields.get("dry_run") == "1",
            lease=token,
            lease_seconds=lease_seconds,
        )
        if sweep.cp.phase == "guard":
            if not _guard(sweep):
                return "failed" if store.get(run_id).finished else "continue"
            if sweep.dry_run:
                return "done"
        return _publish(sweep)
    except Fenced:
        return "fenced"
    finally:
        store.release_lease(run_id, token)


def _refusal(
    target: Target, kind: TargetKind, cutoff: datetime, scope: str
) -> tuple[str, str] | None:
    """Why this sweep must not go on, as (reason, message), or None.

    Checked on every slice, against this process's own targets file and clock: a
    run outlives its trigger, and its target's configuration can change under it.
    """
    try:
        target.check_cutoff(cutoff)
    except CutoffError as exc:
        return "inside_retention", f"{exc}; the sweep stopped and published nothing more"
    if scope and scope != kind.scope_digest:
        return "target_changed", (
            f"target {target.name}'s scope changed since the run started (bucket, prefix "
            "or versions); the sweep stopped, and its next trigger lists afresh"
        )
    return None


def _checkpoint(raw: dict[str, Any] | None, run_token: str) -> Checkpoint:
    if raw is None:
        return Checkpoint(run_token=run_token)
    if "staged" not in raw:
        # Written by a release that did not stage: whatever it counted is not in
        # Redis, so this sweep publishes by listing, as that release did.
        raw = {**raw, "staged": -1}
    # A release before delete conditions kept bare items: they go without one, and
    # the kind looks each up before deleting it.
    pending = [[e, ""] if isinstance(e, str) else list(e) for e in raw.get("pending", [])]
    return Checkpoint(**{**raw, "pending": pending})


@dataclasses.dataclass
class _Slice:
    """What one sweep slice works with."""

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

    def send(self, payload: BatchPayload) -> None:
        self.runtime.dispatcher.send_batch(payload)

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def save(self, new_batches: list[str] | None = None) -> str:
        """Checkpoint; raise :class:`Fenced` if another slice holds the lease now."""
        result = self.store.save_checkpoint(
            self.run_id,
            dataclasses.asdict(self.cp),
            new_batches or [],
            lease=self.lease,
            lease_seconds=self.lease_seconds,
        )
        if result == "fenced":
            log_event(logger, "sweep", self.runtime.settings, level=logging.WARNING,
                      run_id=self.run_id, result="fenced")  # fmt: skip
            raise Fenced(self.run_id)
        return result


def _guard(sweep: _Slice) -> bool:
    """Count expired items before anything is deleted; True once the guard has passed.

    Unless this is a dry run, the expired items are also cut into batches and
    *staged* in Redis as the pages arrive, so that publishing reads the batches
    back instead of listing the target a second time.  Staging stops (and
    publishing lists again) past :data:`STAGE_LIMIT` items, which only a forced
    or very large run reaches.
    """
    store, cp, target, run_id = sweep.store, sweep.cp, sweep.target, sweep.run_id
    limit = None if (sweep.forced or sweep.dry_run) else target.max_delete
    staging = not sweep.dry_run and cp.staged >= 0
    if staging:
        # Batches a killed slice staged after its last checkpoint are listed again below.
        store.keep_staged(run_id, cp.staged)
    for page in sweep.kind.scan(sweep.cutoff, start_after=cp.cursor):
        cp.guard_listed += page.scanned
        cp.guard_expired += len(page.expired)
        if sweep.dry_run and len(cp.sample) < SAMPLE_SIZE:
            cp.sample.extend(page.expired[: SAMPLE_SIZE - len(cp.sample)])
        if page.cursor is not None:
            cp.cursor = page.cursor
        if limit is not None and cp.guard_expired > limit:
            message = (
                f"more than {limit} expired items (max_delete for target {target.name}); nothing "
                f"was deleted. If this is expected, raise max_delete in the targets file or run "
                f"'digest-cleanup run {target.name} --cutoff {sweep.cutoff.isoformat()} --force'"
            )
            store.keep_staged(run_id, 0)
            store.update(run_id, listed=cp.guard_listed, expired_seen=cp.guard_expired)
            store.fail(run_id, "max_delete_exceeded", message)
            finish_run(sweep.runtime, run_id)
            return False
        if staging and cp.guard_expired > STAGE_LIMIT:
            store.keep_staged(run_id, 0)
            cp.staged, cp.pending, staging = -1, [], False
        elif staging:
            cp.pending.extend(_expired(page))
            _stage(sweep, final=False)
        if sweep.out_of_time():
            sweep.save()
            return False
    if sweep.dry_run:
        store.update(
            run_id,
            listed=cp.guard_listed,
            expired=cp.guard_expired,
            sample=cp.sample,
            sweep_done=1,
            status="complete",
            ended_at=now_iso(),
        )
        finish_run(sweep.runtime, run_id)
        return True
    if staging:  # publishing reads the staged batches: everything was listed already
        _stage(sweep, final=True)
        cp.listed = cp.guard_listed
    log_event(
        logger,
        "guard",
        sweep.runtime.settings,
        run_id=run_id,
        expired=cp.guard_expired,
        max_delete=target.max_delete,
        forced=sweep.forced,
        staged=staging,
    )
    cp.phase, cp.cursor = "publish", None
    # The guard's count is the best estimate of the run's size while it streams.
    store.update(run_id, expired_seen=cp.guard_expired)
    sweep.save()
    return True


def _stage(sweep: _Slice, *, final: bool) -> None:
    """Stage the full batches in the pending items (and the rest too when ``final``)."""
    batches = _take_batches(sweep, final=final)
    if batches:
        sweep.cp.staged = sweep.store.stage(sweep.run_id, batches)


def _expired(page: Page) -> list[Expired]:
    conditions = page.conditions or [""] * len(page.expired)
    return [[item, condition] for item, condition in zip(page.expired, conditions, strict=True)]


def _take_batches(sweep: _Slice, *, final: bool) -> list[list[Expired]]:
    """Take the full batches off the pending items (and the rest too when ``final``)."""
    cp, size = sweep.cp, sweep.target.batch_size
    cut = len(cp.pending) if final else len(cp.pending) - len(cp.pending) % size
    batches = [cp.pending[i : i + size] for i in range(0, cut, size)]
    cp.pending = cp.pending[cut:]
    return batches


def _publish(sweep: _Slice) -> SliceResult:
    if sweep.cp.staged >= 0:
        return _publish_staged(sweep)
    return _publish_listed(sweep)


def _publish_staged(sweep: _Slice) -> SliceResult:
    """Publish the staged batches, :data:`STAGED_READ_BATCHES` per checkpoint.

    Staged batch ``n`` is published as sequence number ``n + 1``.  A checkpoint
    counts a chunk of batches in flight (``seq``) *before* they are published;
    ``sent`` catches up after, so a slice that died in between sends that chunk again.
    """
    cp, store, run_id = sweep.cp, sweep.store, sweep.run_id
    if cp.sent < cp.seq:  # batches a crashed slice may not have sent
        for offset, items in enumerate(_read_staged(sweep, cp.sent, cp.seq - cp.sent)):
            sweep.send(_payload(sweep, cp.sent + offset + 1, items))
        cp.sent = cp.seq
    while cp.seq < cp.staged:
        first = cp.seq
        chunk = _read_staged(sweep, first, STAGED_READ_BATCHES)
        cp.seq = first + len(chunk)
        cp.expired += sum(len(entries) for entries in chunk)
        sweep.save([batch_id(run_id, seq) for seq in range(first + 1, cp.seq + 1)])
        for offset, items in enumerate(chunk):
            sweep.send(_payload(sweep, first + offset + 1, items))
        cp.sent = cp.seq
        if cp.seq < cp.staged and sweep.out_of_time():
            sweep.save()
            return "continue"
    result = _done(sweep)
    store.keep_staged(run_id, 0)  # every batch is out: free the memory now
    return result


def _read_staged(sweep: _Slice, start: int, count: int) -> list[list[Any]]:
    chunk = sweep.store.staged(sweep.run_id, start, min(count, sweep.cp.staged - start))
    if not chunk and not sweep.store.holds_lease(sweep.run_id, sweep.lease):
        raise Fenced(sweep.run_id)  # a slice that took over finished and freed them
    if not chunk:
        raise RunStateError(
            f"run {sweep.run_id}: {sweep.cp.staged - start} staged batches are missing from "
            "Redis (evicted? the broker's Redis needs maxmemory-policy noeviction); the "
            "keys they held are still in S3: trigger the run again to sweep it from the listing"
        )
    return chunk


def _publish_listed(sweep: _Slice) -> SliceResult:
    """List the target again and publish batches as pages arrive (when nothing was staged)."""
    cp = sweep.cp
    if cp.outbox:  # batches a crashed slice may not have sent
        for seq, items in cp.outbox:
            sweep.send(_payload(sweep, seq, items))
        # Sent: a slice that now fails listing (and is retried) must not send them again.
        cp.outbox = []
        sweep.save()
    for page in sweep.kind.scan(sweep.cutoff, start_after=cp.cursor):
        cp.listed += page.scanned
        cp.expired += len(page.expired)
        cp.pending.extend(_expired(page))
        if page.cursor is not None:
            cp.cursor = page.cursor
        _emit(sweep, final=False)
        if sweep.out_of_time():
            # Handing over cleanly: the outbox went out, so the next slice must not resend it.
            cp.outbox = []
            sweep.save()
            return "continue"
    _emit(sweep, final=True)
    cp.outbox = []
    return _done(sweep)


def _done(sweep: _Slice) -> SliceResult:
    """Mark the sweep done, only after its last batches went out.

    A sweep marked done is never resumed, so a slice that died between marking
    it and publishing would leave batches in flight that nobody sends.
    """
    cp = sweep.cp
    cp.done = True
    result = sweep.save()
    log_event(
        logger,
        "sweep",
        sweep.runtime.settings,
        run_id=sweep.run_id,
        listed=cp.listed,
        expired=cp.expired,
        batches=cp.seq,
    )
    if result == "finished":
        finish_run(sweep.runtime, sweep.run_id)
    return "done"


def _emit(sweep: _Slice, *, final: bool) -> None:
    """Cut full batches from the pending items, checkpoint them, then publish them."""
    cp = sweep.cp
    batches = _take_batches(sweep, final=final)
    outbox: list[list[Any]] = [[cp.seq + n, items] for n, items in enumerate(batches, 1)]
    cp.seq += len(outbox)
    cp.outbox = outbox
    sweep.save([batch_id(sweep.run_id, seq) for seq, _ in outbox])
    for seq, items in outbox:
        sweep.send(_payload(sweep, seq, items))


def _payload(sweep: _Slice, seq: int, entries: list[Any]) -> BatchPayload:
    # A bare string is an item staged or checkpointed before conditions existed.
    pairs = [(e, "") if isinstance(e, str) else (e[0], e[1]) for e in entries]
    conditions = [condition for _, condition in pairs]
    return BatchPayload(
        run_id=sweep.run_id,
        run_token=sweep.cp.run_token,
        target=sweep.target.name,
        batch_id=batch_id(sweep.run_id, seq),
        seq=seq,
        cutoff=sweep.cutoff.isoformat(),
        items=[item for item, _ in pairs],
        conditions=conditions if any(conditions) else [],
        scope=sweep.kind.scope_digest,
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
    *,
    dry_run: bool = False,
    force: bool = False,
    trigger: str = "cli",
) -> Started:
    """Open the run for (target, cutoff) and enqueue its sweep, unless it already exists.

    A second trigger for a run in progress attaches to it (beat firing twice, an
    operator re-running).  A run whose sweep stopped making progress for longer
    than the visibility timeout gets its sweep enqueued again: it resumes from
    the checkpoint.  A ``failed`` run starts over, since nothing it refused was deleted,
    and so does a finished run whose target's scope has changed since.

    Raises :class:`CutoffError` for a cutoff inside the target's retention window,
    whoever asks for it (the CLI, beat, or a trigger sent through Flower's API).
    """
    target.check_cutoff(cutoff)
    store = runtime.store
    run_id = run_id_for(target.name, cutoff, dry_run=dry_run)
    kind = target.make_kind(runtime.settings)
    fields = {
        "target": target.name,
        "kind": target.kind,
        "location": kind.describe(),
        "scope": kind.scope_digest,
        "conditional_deletes": kind.conditional,
        "cutoff": cutoff.isoformat(),
        "dry_run": dry_run,
        "forced": force,
        "trigger": trigger,
        "batch_size": target.batch_size,
        "max_delete": target.max_delete,
        "config_digest": target.config_digest,
    }
    status = store.open(run_id, fields)
    if status in FINAL_STATUSES and status != "failed":
        previous = store.get(run_id).fields.get("scope", "")
        if previous and previous != kind.scope_digest:
            status = "failed"  # listed under another scope: list again under this one
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
        runtime.dispatcher.send_sweep(run_id)
        return Started(run_id, action, "running")
    run = store.get(run_id)
    if run.finished and run.fields.get("report_pending") == "1":
        finish_run(runtime, run_id)  # its report could not be written before; try again
    if (
        run.status == "running"
        and run.fields.get("sweep_done") != "1"
        and _stalled(runtime, run.fields)
    ):
        runtime.dispatcher.send_sweep(run_id)
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
    if isinstance(exc, RunStateError):  # what the sweep needs is gone; retrying cannot help
        store.fail(run_id, "run_state_lost", str(exc))
        finish_run(runtime, run_id)
        return None
    if isinstance(exc, ItemError):
        detail = f"{exc.code}: {exc.message}"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, PermanentError):
        errors = store.count_sweep_error(run_id)
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
