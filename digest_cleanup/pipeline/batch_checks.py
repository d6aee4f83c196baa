"""What a batch must pass before anything in it is deleted.

The worker runs these checks on every delivery, and a redrive runs the same
ones before it moves an entry back (see :mod:`digest_cleanup.pipeline.redrive`),
so a redrive is refused for exactly what a delivery would be refused for.
"""

from __future__ import annotations

from digest_cleanup.errors import CutoffError, RefusedBatch, TargetsFileError
from digest_cleanup.kinds import TargetKind
from digest_cleanup.pipeline.batches import BatchPayload
from digest_cleanup.pipeline.runtime import Runtime


def check_batch(runtime: Runtime, payload: BatchPayload) -> TargetKind:
    """Return the kind for a batch that may be deleted, or raise :class:`RefusedBatch`.

    Every check reads this worker's own targets file and clock, never the
    message's word: a batch outlives the configuration that listed it (retries,
    redrives, duplicate deliveries), and a message can be forged.  A redrive runs
    the same checks before it moves an entry (see :mod:`digest_cleanup.pipeline.redrive`).
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
            "or versions changed); nothing was deleted. Put the configuration back "
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
        target.check_cutoff(payload.cutoff_datetime())
    except CutoffError as exc:
        raise RefusedBatch("inside_retention", f"{exc}; nothing in the batch was deleted") from None
    run = runtime.store.find(payload.run_id)
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
    return kind
