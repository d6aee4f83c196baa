"""One attempt at a batch: check it, delete it, decide, follow up, record.

The order is what makes at-least-once delivery harmless:

1. Refuse what must not be deleted before touching the store: a message that
   does not decode is dead-lettered as poison; a batch that decodes but fails a
   check (unknown target or run, a stale incarnation, a batch id or keys its run
   never published, a run that was aborted, its target's scope changed since it
   was listed, a key out of scope, a condition that is not an ETag, a cutoff
   inside the retention window by the earliest trusted clock) is dead-lettered
   whole, with every key and condition, and can be redriven.
2. Wait for the keys' share of the target's delete budget (see
   :mod:`~digest_cleanup.store.budget`).  A wait is neither a retry nor a
   delivery; one longer than a held message may wait is handed back as a copy
   with a short countdown (``deferred``).  After the wait the run's status is
   read again, so an ``abort`` stops every batch that has not yet sent.
3. Count the delivery; past ``max_deliveries`` the batch is ``worker_lost``.
4. Delete (idempotent), tell the budget if the store pushed back, publish
   follow-ups (retry, dead letter), and only then record the attempt.  A crash
   before recording redelivers the message, which deletes again harmlessly and
   publishes follow-ups that are themselves claimed once; a duplicate that
   arrives after recording counts nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from digest_cleanup.clock import now_iso
from digest_cleanup.errors import PoisonMessage, RefusedBatch
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.logs import log_event
from digest_cleanup.model.batches import (
    BatchPayload,
    BatchRecord,
    BatchReport,
    Decision,
    backoff,
    decide,
)
from digest_cleanup.model.dead_letters import make_entry
from digest_cleanup.pipeline.batch_checks import (
    UNACCOUNTED,
    AlreadyRecorded,
    check_delivery,
    ensure_running,
)
from digest_cleanup.pipeline.poison import poison_batch
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.store.budget import DEFER_SECONDS, longest_wait

logger = logging.getLogger("digest_cleanup.batch")


def process(runtime: Runtime, raw: Any, task_id: str) -> BatchReport:
    """Run one delivery of a batch message and return what it did.

    Follow-ups go through ``runtime.dispatcher``; a retry keeps ``task_id``, so
    Flower shows one task going through its retries.
    """
    started = time.monotonic()
    try:
        payload = BatchPayload.from_message(raw)
    except PoisonMessage as poison:
        return poison_batch(runtime, raw, task_id, poison)
    try:
        kind = check_delivery(runtime, payload)
    except AlreadyRecorded:
        runtime.store.runs.count_delivery(payload.run_id, payload.claim)  # counts the duplicate
        return _duplicate(runtime, payload)
    except RefusedBatch as refused:
        return _refuse(runtime, payload, refused, task_id, started)

    store = runtime.store
    settings = runtime.settings
    budget = runtime.budget(payload.target)
    wait_cap = longest_wait(settings.visibility_timeout)
    drawn = budget.draw(len(payload.keys), wait_cap) if budget is not None else None
    if drawn is not None and not drawn.granted:
        return _defer(runtime, payload, task_id, drawn.waited)
    try:
        # Read again after the wait: an abort stops every batch that has not yet sent.
        ensure_running(runtime, store.runs.run_status(payload.run_id), payload)
    except RefusedBatch as refused:
        return _refuse(runtime, payload, refused, task_id, started)
    deliveries = store.runs.count_delivery(payload.run_id, payload.claim)
    if deliveries > 1 and store.runs.is_recorded(payload.run_id, payload.claim):
        # The recorded attempt already deleted and sent its follow-ups; sending them
        # again would start a second retry chain, or dead-letter keys that are gone.
        return _duplicate(runtime, payload)
    if deliveries > settings.max_deliveries:
        lost = f"{deliveries - 1} deliveries died"
        return _dead_whole(runtime, payload, task_id, started, "worker_lost", lost, "")

    t0 = time.monotonic()
    results = kind.delete(payload.keys, payload.cutoff_datetime(), payload.conditions)
    delete_seconds = time.monotonic() - t0
    if budget is not None:
        budget.report(results, kind.throttle_codes)
    decided = decide(results, payload.attempt, settings.max_retries)
    return _follow_up_and_record(
        runtime,
        payload,
        task_id,
        decided,
        started,
        reason="",
        delete_seconds=delete_seconds,
        budget_wait=drawn.waited if drawn else 0.0,
    )


def _duplicate(runtime: Runtime, payload: BatchPayload) -> BatchReport:
    """Report a delivery of an attempt already recorded; it deletes and counts nothing."""
    report = BatchReport(
        status="duplicate",
        batch_id=payload.batch_id,
        run_id=payload.run_id,
        target=payload.target,
        recorded="duplicate",
    )
    log_event(logger, "batch", runtime.settings, **report.as_dict(), seq=payload.seq,
              attempt=payload.attempt, generation=payload.generation)  # fmt: skip
    return report


def _defer(runtime: Runtime, payload: BatchPayload, task_id: str, wait: float) -> BatchReport:
    """Hand back a batch whose budget is further off than it may wait: the same attempt
    (no retry spent, no delivery counted), with a countdown short enough that Redis
    never restores a message a worker holds."""
    countdown = round(min(wait, DEFER_SECONDS), 2)
    runtime.dispatcher.send_batch(payload, countdown=countdown, task_id=task_id or None)
    report = BatchReport(
        status="deferred",
        batch_id=payload.batch_id,
        run_id=payload.run_id,
        target=payload.target,
        countdown=countdown,
        reason="delete_budget",
    )
    log_event(logger, "batch", runtime.settings, **report.as_dict(), seq=payload.seq,
              attempt=payload.attempt, wait=round(wait, 2))  # fmt: skip
    return report


def give_up(
    runtime: Runtime, raw: Any, error: Exception, deliveries: int, task_id: str
) -> BatchReport:
    """Dead-letter a batch whose every delivery raised, whole, as ``worker_error``.

    An exception on the batch path (a dropped table, a database down, a setting
    missing on this worker) is retried with backoff by the task; past
    ``CLEANUP_MAX_DELIVERIES`` it ends here, so nothing requeues forever.
    """
    started = time.monotonic()
    try:
        payload = BatchPayload.from_message(raw)
    except PoisonMessage as poison:
        return poison_batch(runtime, raw, "", poison)
    message = (
        f"{deliveries} deliveries failed, the last with {type(error).__name__}: {error}; "
        "nothing more was deleted. Fix the cause, then redrive"
    )
    refused = RefusedBatch("worker_error", message[:1000])
    return _refuse(runtime, payload, refused, task_id, started)


def _refuse(
    runtime: Runtime,
    payload: BatchPayload,
    refused: RefusedBatch,
    task_id: str,
    started: float,
) -> BatchReport:
    """Dead-letter a refused batch whole; count it only in the run incarnation it belongs to.

    A batch of an unknown run, of an earlier incarnation, of an ended run, or one
    its run never published as it stands (:data:`UNACCOUNTED`), counts nothing:
    the current run's counters are its own, and a forged message cannot end a
    real batch.
    """
    run = runtime.store.runs.find(payload.run_id)
    current = (
        refused.code not in UNACCOUNTED
        and run is not None
        and run.fields.get("target") == payload.target
        and run.fields.get("token", "") == payload.run_token
        # What the run listed under: a copy with another scope or cutoff is not its batch.
        and run.fields.get("scope", payload.scope) == payload.scope
        and run.fields.get("cutoff") == payload.cutoff
        and runtime.store.runs.is_in_flight(payload.run_id, payload.batch_id)
        and runtime.store.sweeps.is_published(payload)
    )
    code, message = refused.code, refused.message
    if current:
        return _dead_whole(runtime, payload, task_id, started, code, message, message)
    dead = {i: KeyResult(i, Outcome.PERMANENT, code, message) for i in payload.keys}
    # An id of its own: a message the run cannot vouch for never merges into a real entry.
    digest = hashlib.sha256(json.dumps(payload.to_message(), sort_keys=True).encode())
    own_id = f"dl-refused-{payload.batch_id}-{digest.hexdigest()[:12]}"
    letter = make_entry(payload, dead, code, message, entry_id=own_id)
    entry_id = letter.entry_id
    runtime.dispatcher.send_dead_letter(letter)
    report = BatchReport(
        status="dead_lettered",
        batch_id=payload.batch_id,
        run_id=payload.run_id,
        target=payload.target,
        dead_lettered=len(dead),
        entry_id=entry_id,
        reason=code,
    )
    log_event(logger, "batch", runtime.settings, level=logging.WARNING, **report.as_dict())
    return report


def _dead_whole(
    runtime: Runtime,
    payload: BatchPayload,
    task_id: str,
    started: float,
    code: str,
    message: str,
    entry_message: str,
) -> BatchReport:
    """Dead-letter every key of the batch with one code, and record it against its run."""
    dead = [KeyResult(i, Outcome.PERMANENT, code, message) for i in payload.keys]
    return _follow_up_and_record(
        runtime,
        payload,
        task_id,
        decide(dead, payload.attempt, 0),
        started,
        reason=code,
        delete_seconds=0.0,
        message=entry_message,
    )


def _follow_up_and_record(
    runtime: Runtime,
    payload: BatchPayload,
    task_id: str,
    decided: Decision,
    started: float,
    *,
    reason: str,
    delete_seconds: float,
    message: str = "",
    budget_wait: float = 0.0,
) -> BatchReport:
    report = BatchReport(
        status="done",
        batch_id=payload.batch_id,
        run_id=payload.run_id,
        target=payload.target,
        deleted=decided.deleted,
        skipped=decided.skipped,
        delete_seconds=round(delete_seconds, 4),
        budget_wait=round(budget_wait, 3),
    )
    _send_follow_ups(runtime, payload, task_id, decided, report, reason, message)
    record = _batch_record(payload, decided, started + budget_wait, delete_seconds)
    report.recorded = runtime.store.runs.record(payload.run_id, payload.target, record)
    if report.recorded == "duplicate":
        report.status = "duplicate"
    log_event(logger, "batch", runtime.settings, **report.as_dict(), seq=payload.seq,
              attempt=payload.attempt, generation=payload.generation,
              duration=round(time.monotonic() - started, 4))  # fmt: skip
    if report.recorded == "finished":
        from digest_cleanup.pipeline.lifecycle import finish_run

        finish_run(runtime, payload.run_id)
    return report


def _send_follow_ups(
    runtime: Runtime,
    payload: BatchPayload,
    task_id: str,
    decided: Decision,
    report: BatchReport,
    reason: str,
    message: str,
) -> None:
    """Send the retry of the keys that failed transiently, and the dead letter of the rest."""
    if decided.retry:
        countdown = backoff(payload.attempt, runtime.settings, decided.retry_after)
        failures = {i: [r.code, r.message[:500]] for i, r in decided.retry.items()}
        retry = payload.subset(
            list(decided.retry),
            attempt=payload.attempt + 1,
            failures=failures,
            first_failure_at=payload.first_failure_at or now_iso("seconds"),
            published_at=time.time(),
        )
        runtime.dispatcher.send_batch(retry, countdown=countdown, task_id=task_id or None)
        report.status, report.retrying = "retrying", len(decided.retry)
        report.countdown = round(countdown, 2)
    if decided.dead:
        if not reason:
            transient = any(r.outcome is Outcome.TRANSIENT for r in decided.dead.values())
            reason = "retries_exhausted" if transient else "permanent_error"
        letter = make_entry(payload, decided.dead, reason, message)
        runtime.dispatcher.send_dead_letter(letter)
        report.status = "dead_lettered" if not decided.retry else report.status
        report.dead_lettered = len(decided.dead)
        report.entry_id, report.reason = letter.entry_id, reason


def _batch_record(
    payload: BatchPayload, decided: Decision, started: float, delete_seconds: float
) -> BatchRecord:
    """What the run store records of this attempt."""
    latency = time.time() - payload.published_at if payload.published_at else None
    return BatchRecord(
        batch_id=payload.batch_id,
        claim=payload.claim,
        deleted=decided.deleted,
        dead_lettered=len(decided.dead),
        skipped=decided.skipped,
        retries=1 if decided.retry else 0,
        codes=decided.codes(),
        retried_codes=sorted({r.code for r in decided.retry.values()}),
        terminal=not decided.retry,
        first_generation=payload.generation == 0,
        latency=latency,
        service_seconds=time.monotonic() - started if delete_seconds else None,
        delete_seconds=delete_seconds,
        keys=len(payload.keys),
        skipped_keys=[(r.key, r.code, r.message) for r in decided.skipped_keys],
    )
