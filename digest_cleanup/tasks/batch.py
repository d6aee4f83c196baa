"""The batch task: one attempt at deleting one batch."""

from __future__ import annotations

from typing import Any

import redis
from celery import shared_task
from celery.exceptions import Reject, Retry

from digest_cleanup.model.batches import backoff
from digest_cleanup.pipeline.batch import give_up, process
from digest_cleanup.tasks.base import CleanupTask, DeadLettered
from digest_cleanup.tasks.dispatch import BATCH_TASK


@shared_task(bind=True, base=CleanupTask, name=BATCH_TASK, max_retries=None)
def delete_batch(self: CleanupTask, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Delete one batch; :func:`process` sends its retries and dead letters."""
    raw: Any = kwargs if not args else {"positional": list(args)[:3], **kwargs}
    task_id = self.request.id or ""
    try:
        report = process(self.runtime, raw, task_id)
    except redis.RedisError as exc:
        # The run store is unreachable, so nothing can be decided or recorded: hand
        # the message back.  Redis is also the broker, so nothing loops meanwhile.
        raise Reject(f"run store unavailable: {exc}", requeue=True) from exc
    except Exception as exc:
        # Anything else (a dropped table, a database down, a bug in a kind) counts as
        # a delivery: retried with backoff, and dead-lettered past the cap.
        settings = self.runtime.settings
        deliveries = self.request.retries + 1
        if deliveries < settings.max_deliveries:
            raise self.retry(countdown=backoff(self.request.retries, settings), exc=exc) from exc
        try:
            report = give_up(self.runtime, raw, exc, deliveries, task_id)
        except redis.RedisError as lost:
            raise Reject(f"run store unavailable: {lost}", requeue=True) from lost
    summary = report.as_dict()
    if report.entry_id and report.status in ("dead_lettered", "poison"):
        raise DeadLettered(
            f"dead-lettered as {report.entry_id}: {report.dead_lettered} keys, "
            f"reason {report.reason}"
        )
    if report.status == "retrying":
        raise Retry(f"{report.retrying} keys retry in {report.countdown}s", when=report.countdown)
    return summary
