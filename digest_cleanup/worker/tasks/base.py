"""The base task: access to the runtime, and how follow-ups are published."""

from __future__ import annotations

from typing import Any

from celery import Task

from digest_cleanup.errors import CleanupError
from digest_cleanup.pipeline.batches import BatchPayload, batch_total
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.worker.app import BATCH_QUEUE, SWEEP_QUEUE, runtime_of

#: What Flower shows instead of a batch's kwargs: never the keys themselves.
HIDDEN_KWARGS = "{...}"


class DeadLettered(CleanupError):
    """Raised after a batch was dead-lettered, so Flower shows it failed and names the entry."""


class CleanupTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Shared by every digest-cleanup task."""

    #: Expected outcomes, logged in one line instead of a traceback.
    throws = (DeadLettered,)

    @property
    def runtime(self) -> Runtime:
        return runtime_of(self.app)

    def publish_batch(
        self, payload: BatchPayload, *, countdown: float | None = None, task_id: str | None = None
    ) -> None:
        run = self.runtime.store.find(payload.run_id)
        total = batch_total(run.fields if run else None, payload.seq)
        self.app.send_task(
            "digest_cleanup.delete_batch",
            kwargs=payload.to_message(),
            task_id=task_id or payload.batch_id,
            queue=BATCH_QUEUE,
            countdown=countdown,
            argsrepr=payload.describe(of=total),
            kwargsrepr=HIDDEN_KWARGS,
        )

    def enqueue_sweep(self, run_id: str, countdown: float | None = None) -> None:
        enqueue_sweep(self.app, run_id, countdown)


def enqueue_sweep(app: Any, run_id: str, countdown: float | None = None) -> None:
    """Publish one sweep slice for ``run_id``."""
    app.send_task("digest_cleanup.sweep", args=[run_id], queue=SWEEP_QUEUE, countdown=countdown)
