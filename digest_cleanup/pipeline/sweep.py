"""The sweep: stream a target's listing and fan expired keys out as batches.

A sweep runs in *slices* of at most :data:`SLICE_SECONDS` (or a third of the
visibility timeout), each one a short task that sends the next.  No task
outlives the visibility timeout, a killed sweep resumes from its checkpoint
(:mod:`~digest_cleanup.model.checkpoint`), and a lease keeps two copies of
a slice from sweeping at once.

Before it sends anything, the sweep counts expired keys (the *guard pass*)
and refuses a run past the target's ``max_delete``: such a run deletes nothing.
The guard pass cuts the expired keys into batches and *stages* them in Redis
as it counts them, so the listing is paid for once and the first batches go out
as soon as the guard has passed.  There is one way to send: the publish phase
drains the stage, checkpointing each chunk of batches as in flight *before*
sending it, so a slice that dies sends that chunk again; batch ids are
deterministic and attempts are claimed once, so a batch sent twice is deleted
harmlessly and counted once, and none is ever lost.  A run too big to stage
whole (past :data:`~digest_cleanup.pipeline.sweep_phases.STAGE_LIMIT` keys)
refills the stage a window at a time from a second listing, and drains it the
same way.  The stage lives with the run's
state; a run whose state is lost (Redis restarted empty) is swept again from
the listing.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from digest_cleanup.errors import CutoffError, PermanentError, RunStateError, StoreError
from digest_cleanup.kinds import TargetKind
from digest_cleanup.logs import log_event
from digest_cleanup.model.batches import backoff
from digest_cleanup.model.checkpoint import Checkpoint
from digest_cleanup.pipeline.lifecycle import finish_run
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep_phases import Fenced, Slice, SliceResult, guard_pass, publish
from digest_cleanup.pipeline.trusted_clock import trusted_now
from digest_cleanup.targets import Target

logger = logging.getLogger("digest_cleanup.sweep")

#: Longest a sweep slice runs before handing over to the next one.
SLICE_SECONDS = 30.0

#: How much longer than a slice its lease lasts, so a live slice is never overlapped.
LEASE_MARGIN_SECONDS = 10.0


def sweep_slice(
    runtime: Runtime, run_id: str, *, slice_seconds: float | None = None
) -> SliceResult:
    """Advance the sweep of ``run_id`` by one slice; ``continue`` means send the next."""
    store = runtime.store
    run = store.runs.find(run_id)
    if run is None:
        return "missing"
    if run.finished or run.fields.get("sweep_done") == "1":
        return "done"
    limit = slice_seconds or min(SLICE_SECONDS, runtime.settings.visibility_timeout / 3)
    # The lease outlives a slice a little, so a live slice is never overlapped, and a
    # dead one frees the sweep well before its message is redelivered.  Every
    # checkpoint renews it, and a slice that lost it is fenced off (see RunStore).
    lease_seconds = limit + LEASE_MARGIN_SECONDS
    fence = store.sweeps.take_lease(run_id, lease_seconds)
    if fence is None:
        return "attached"
    try:
        target = runtime.target(run["target"])
        kind = runtime.kind(target.name)
        cutoff = datetime.fromisoformat(run["cutoff"])
        now = trusted_now(store, kind, target=target.name)
        refusal = _refusal(target, kind, cutoff, run.fields.get("scope", ""), now)
        if refusal is not None:
            store.runs.fail(run_id, *refusal)
            finish_run(runtime, run_id)
            return "failed"
        sweep = Slice(
            runtime=runtime,
            run_id=run_id,
            target=target,
            kind=kind,
            cutoff=cutoff,
            cp=Checkpoint.from_stored(
                store.sweeps.load_checkpoint(run_id), run.fields.get("token", "")
            ),
            deadline=time.monotonic() + limit,
            forced=run.fields.get("forced") == "1",
            dry_run=run.fields.get("dry_run") == "1",
            lease=fence,
            lease_seconds=lease_seconds,
        )
        # Batches a killed slice staged after its last checkpoint are listed again.
        sweep.keep_staged(sweep.cp.stage.staged)
        if sweep.cp.phase == "guard":
            if not guard_pass(sweep):
                return "failed" if store.runs.get(run_id).finished else "continue"
            if sweep.dry_run:
                return "done"
        return publish(sweep)
    except Fenced:
        return "fenced"
    finally:
        store.sweeps.release_lease(run_id, fence)


def _refusal(
    target: Target, kind: TargetKind, cutoff: datetime, scope: str, now: datetime
) -> tuple[str, str] | None:
    """Why this sweep must not go on, as (reason, message), or None.

    Checked on every slice, against this process's own targets file and the earliest
    trusted clock (``now``): a run outlives its trigger, and its target's
    configuration can change under it.
    """
    try:
        target.check_cutoff(cutoff, now=now)
    except CutoffError as exc:
        return "inside_retention", f"{exc}; the sweep stopped and published nothing more"
    if scope and scope != kind.scope_digest:
        return "target_changed", (
            f"target {target.name}'s scope changed since the run started (bucket, prefix, "
            "versions or conditional_deletes); the sweep stopped, and its next trigger lists "
            "afresh"
        )
    return None


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
        store.runs.fail(run_id, "run_state_lost", str(exc))
        finish_run(runtime, run_id)
        return None
    if isinstance(exc, StoreError):
        detail = f"{exc.code}: {exc.message}"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, PermanentError):
        errors = store.runs.count_sweep_error(run_id)
        if errors <= settings.max_retries:
            retry_after = exc.retry_after if isinstance(exc, StoreError) else None
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
    store.runs.fail(run_id, "listing_failed", f"listing the target failed: {detail}")
    finish_run(runtime, run_id)
    return None
