"""The batch task: one attempt at deleting one batch."""

from __future__ import annotations

from typing import Any

import redis
from celery import shared_task
from celery.exceptions import Reject, Retry

from digest_cleanup.pipeline.attempts import give_up, process
from digest_cleanup.pipeline.batches import BatchPayload, backoff
from digest_cleanup.pipeline.dead_letter import index_headers
from digest_cleanup.worker.tasks.base import HIDDEN_KWARGS, CleanupTask, DeadLettered


class _TaskPublisher:
    """Publishes a batch's follow-ups (retry, dead letter) through the task's app."""

    def __init__(self, task: CleanupTask) -> None:
        self.task = task

    def retry(self, payload: BatchPayload, countdown: float) -> None:
        # Same task id, so Flower shows one task going through its retries.
        self.task.publish_batch(payload, countdown=countdown, task_id=self.task.request.id)

    def dead_letter(self, entry_id: str, kwargs: dict[str, Any], label: str) -> None:
        self.task.app.send_task(
            "digest_cleanup.delete_batch",
            kwargs=kwargs,
            task_id=entry_id,
            queue=self.task.runtime.settings.dead_letter_queue,
            argsrepr=f"dead letter: {label}",
            kwargsrepr=HIDDEN_KWARGS,
            # What the dead-letter index files the entry under, readable without
            # decoding the body (see DeadLetterQueue.absorb).
            headers=index_headers(kwargs),
        )


@shared_task(bind=True, base=CleanupTask, name="digest_cleanup.delete_batch", max_retries=None)
def delete_batch(self: CleanupTask, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Delete one batch; retries and dead letters are published by :func:`process`."""
    raw: Any = kwargs if not args else {"positional": list(args)[:3], **kwargs}
    publisher = _TaskPublisher(self)
    try:
        report = process(self.runtime, raw, self.request.id or "", publisher)
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
            report = give_up(self.runtime, raw, exc, deliveries, publisher)
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
