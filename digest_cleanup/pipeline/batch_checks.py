"""What a batch must pass before anything in it is deleted.

The worker runs these checks on every delivery, and a redrive runs the same
ones before it moves an entry back (see :mod:`digest_cleanup.ops.redrive`),
so a redrive is refused for exactly what a delivery would be refused for.

The message carries no authority of its own.  What a batch may delete is what
the run store says its sweep published: the batch id must be one the run put
in flight, and every key with its condition must be one of that batch's
published digest (:func:`~digest_cleanup.model.batches.entry_digests`).  A
message that fails that is refused whole, dead-lettered with its own reason,
and counted in no run (:data:`UNACCOUNTED`): it is not the run's to count.
"""

from __future__ import annotations

from collections.abc import Mapping

from digest_cleanup.errors import CutoffError, RefusedBatch, TargetsFileError
from digest_cleanup.kinds import TargetKind
from digest_cleanup.model.batches import BatchPayload, unpublished_keys
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.trusted_clock import trusted_now

#: Refusals of a message the run never published as it stands: dead-lettered, and
#: counted in no run, so a forged message cannot end a real batch or move a counter.
UNACCOUNTED = frozenset({"unknown_batch", "batch_mismatch", "batch_not_in_flight", "run_ended"})


class AlreadyRecorded(Exception):
    """Control flow, not an error: a duplicate delivery of an attempt already recorded."""


def check_delivery(runtime: Runtime, payload: BatchPayload) -> TargetKind:
    """What a worker checks on delivery: :func:`check_batch`, and the batch is in flight.

    A message its run published (so not a forgery) whose attempt is already recorded is
    a duplicate delivery (:class:`AlreadyRecorded`), whatever the run's status now: it
    deletes and dead-letters nothing.  One no longer in flight otherwise is refused
    (``batch_not_in_flight``).
    """
    kind = check_batch(runtime, payload, delivery=True)
    store = runtime.store
    if not store.runs.is_in_flight(payload.run_id, payload.batch_id):
        raise RefusedBatch(
            "batch_not_in_flight",
            f"batch {payload.batch_id} of run {payload.run_id} is not in flight (it ended, "
            "or was never published); nothing was deleted",
        )
    return kind


def ensure_running(
    runtime: Runtime, run: Mapping[str, str], payload: BatchPayload, *, redriving: bool = False
) -> None:
    """Refuse a batch of a run that has ended: aborted, failed or finished.

    A redrive of an ended (not aborted) run's dead letters may still delete: the
    operator asked for exactly those keys.  On delivery the store says whether the
    batch was redriven, never the message's ``generation``; ``redriving`` is the
    redrive's own check, before it moves an entry.  An aborted run deletes nothing more.
    """
    status, reason = run.get("status", ""), run.get("reason", "")
    if status == "running":
        return
    if (
        reason != "aborted"
        and payload.generation > 0
        and (redriving or runtime.store.runs.is_redriven(payload.run_id, payload.batch_id))
    ):
        return
    why = "was aborted" if reason == "aborted" else f"ended {status or 'unknown'}"
    raise RefusedBatch(
        "run_ended",
        f"run {payload.run_id} {why}; nothing was deleted. The target's next run lists "
        "these keys afresh; purge this entry once it has",
    )


def check_batch(
    runtime: Runtime, payload: BatchPayload, *, delivery: bool = False, redriving: bool = False
) -> TargetKind:
    """Return the kind for a batch that may be deleted, or raise :class:`RefusedBatch`.

    Every check reads this worker's own targets file and clock, never the
    message's word: a batch outlives the configuration that listed it (retries,
    redrives, duplicate deliveries), and a message can be forged.  A redrive runs
    the same checks before it moves an entry (see :mod:`digest_cleanup.ops.redrive`).
    With ``delivery``, an authentic message whose attempt is already recorded raises
    :class:`AlreadyRecorded` before the run's status is looked at; ``redriving`` is a
    redrive's check before it moves an entry (see :func:`ensure_running`).
    """
    try:
        target = runtime.target(payload.target)
    except TargetsFileError as exc:
        raise RefusedBatch("unknown_target", f"{exc}; nothing in the batch was deleted") from None
    kind = runtime.kind(target.name)
    if len(payload.keys) > kind.max_batch_size:
        raise RefusedBatch(
            "too_many_keys",
            f"{len(payload.keys)} keys; one {target.kind} delete takes at most "
            f"{kind.max_batch_size}",
        )
    if payload.scope != kind.scope_digest:
        raise RefusedBatch(
            "target_changed",
            f"the batch was listed under another configuration of target {target.name} "
            f"(scope {payload.scope or 'unknown'}, now {kind.scope_digest}: bucket, prefix "
            "versions or conditional_deletes changed); nothing was deleted. Put the "
            "configuration back "
            "and redrive, or purge this entry: the target's next run lists it afresh",
        )
    # Scope first: a key outside the target is refused whatever else the message claims.
    for key in payload.keys:
        reason = kind.out_of_scope(key)
        if reason is not None:
            raise RefusedBatch(
                "out_of_scope", f"a key is {reason}; nothing in the batch was deleted"
            )
    try:
        now = trusted_now(runtime.store, kind, target=target.name)
        target.check_cutoff(payload.cutoff_datetime(), now=now)
    except CutoffError as exc:
        raise RefusedBatch("inside_retention", f"{exc}; nothing in the batch was deleted") from None
    run = _check_run(runtime, payload)
    _check_published(runtime, payload)
    if delivery and runtime.store.runs.is_recorded(payload.run_id, payload.claim):
        raise AlreadyRecorded(payload.claim)
    ensure_running(runtime, run, payload, redriving=redriving)
    for condition in payload.conditions or [""] * len(payload.keys):
        problem = kind.condition_problem(condition)
        if problem is not None:
            raise RefusedBatch("bad_condition", f"{problem}; nothing in the batch was deleted")
    return kind


def _check_run(runtime: Runtime, payload: BatchPayload) -> Mapping[str, str]:
    """Refuse a batch of an unknown run, another incarnation or another cutoff; the run."""
    run = runtime.store.runs.find(payload.run_id)
    if run is None or run.fields.get("target") != payload.target:
        raise RefusedBatch(
            "unknown_run",
            f"run {payload.run_id!r} is not in the run store (lost with a Redis restart, or "
            "forged); nothing was deleted; run the target again to re-list from the store",
        )
    if run.fields.get("token", "") != payload.run_token:
        raise RefusedBatch(
            "stale_run",
            f"the batch belongs to an earlier incarnation of run {payload.run_id!r} (Redis "
            "restarted or the run was restarted since it was published); nothing was deleted; "
            "the current run re-lists its own keys",
        )
    if run.fields.get("cutoff") != payload.cutoff:
        raise RefusedBatch(
            "cutoff_mismatch",
            f"message cutoff {payload.cutoff} differs from the run's {run.fields.get('cutoff')}",
        )
    return run.fields


def _check_published(runtime: Runtime, payload: BatchPayload) -> None:
    """Refuse a batch id its run never published, or keys and conditions it did not hold."""
    published = runtime.store.sweeps.published_digest(payload.run_id, payload.batch_id)
    if published is None:
        raise RefusedBatch(
            "unknown_batch",
            f"run {payload.run_id} never published a batch {payload.batch_id!r} (forged, or "
            "from before a Redis restart); nothing was deleted",
        )
    strays = unpublished_keys(published, payload)
    if strays:
        raise RefusedBatch(
            "batch_mismatch",
            f"{len(strays)} of the batch's keys, with their conditions, are not what its "
            f"sweep published for {payload.batch_id} (forged or altered); nothing was deleted",
        )
