"""Sweep slices and beat triggers."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import redis
from celery import shared_task
from celery.exceptions import Reject

from digest_cleanup.clock import utcnow
from digest_cleanup.errors import CutoffError
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.sweep import on_slice_error, sweep_slice
from digest_cleanup.targets import CATCH_UP_WINDOW
from digest_cleanup.tasks.base import CleanupTask
from digest_cleanup.tasks.dispatch import SWEEP_TASK, TRIGGER_TASK

#: How long a beat's lock on a slot is kept: past the catch-up window.
SLOT_LOCK_SECONDS = int(CATCH_UP_WINDOW.total_seconds()) + 86_400


@shared_task(bind=True, base=CleanupTask, name=SWEEP_TASK)
def sweep(self: CleanupTask, run_id: str) -> dict[str, Any]:
    """Advance a run's sweep by one slice, and enqueue the next slice if needed."""
    try:
        result = sweep_slice(self.runtime, run_id)
    except redis.RedisError as exc:
        # The run store is unreachable: nothing can be decided, so hand the slice back.
        raise Reject(f"run store unavailable: {exc}", requeue=True) from exc
    except Exception as exc:  # every listing failure must end in a decision, not a stuck run
        countdown = on_slice_error(self.runtime, run_id, exc)
        if countdown is None:
            return {"run_id": run_id, "result": "failed"}
        self.runtime.dispatcher.send_sweep(run_id, countdown=countdown)
        return {"run_id": run_id, "result": "retrying", "countdown": countdown}
    if result == "continue":
        self.runtime.dispatcher.send_sweep(run_id)
    return {"run_id": run_id, "result": result}


@shared_task(bind=True, base=CleanupTask, name=TRIGGER_TASK)
def trigger(
    self: CleanupTask, target: str, now: str | None = None, catch_up: bool = False
) -> dict[str, Any]:
    """Start the run for the target's latest scheduled slot, once per slot.

    Beat sends this on the target's crontab, and once per target when beat
    starts (``catch_up``).  Both key the run on the slot, and the slot is
    locked in Redis first, so two beats, or a beat restarted after downtime,
    give exactly one run per slot, and a slot missed within the catch-up
    window runs once when beat comes back.
    """
    runtime = self.runtime
    tgt = runtime.target(target)
    at = datetime.fromisoformat(now) if now else utcnow()
    slot = tgt.last_slot(at)
    if catch_up and at - slot > CATCH_UP_WINDOW:
        return {"target": target, "slot": slot.isoformat(), "action": "too_old"}
    slot_name = slot.strftime("%Y%m%dT%H%MZ")
    holder = self.request.id or uuid.uuid4().hex
    # The lock holds the task id: a redelivery of this very message (its worker died
    # between locking and starting) must still start the run, or the slot is skipped.
    if not runtime.store.targets.lock_slot(target, slot_name, holder, SLOT_LOCK_SECONDS):
        return {"target": target, "slot": slot.isoformat(), "action": "already_locked"}
    try:
        started = start(
            runtime,
            tgt,
            tgt.cutoff_for(slot),
            trigger="beat-catch-up" if catch_up else "beat",
        )
    except CutoffError as exc:
        # A trigger whose ``now`` lies ahead of this worker's clock (sent by hand,
        # say through Flower's API) would delete inside the retention window.
        runtime.store.targets.unlock_slot(target, slot_name, holder)
        return {"target": target, "slot": slot.isoformat(), "action": "refused", "reason": str(exc)}
    except Exception:
        # A locked slot without a run would be skipped: free it for the next trigger.
        # The run id is keyed on the slot, so a later start cannot double the run.
        runtime.store.targets.unlock_slot(target, slot_name, holder)
        raise
    return {
        "target": target,
        "slot": slot.isoformat(),
        "run_id": started.run_id,
        "action": started.action,
    }
