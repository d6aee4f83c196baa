"""The pipeline's :class:`~digest_cleanup.pipeline.messaging.Dispatcher`, on Celery."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from digest_cleanup.model.batches import BatchPayload, batch_total
from digest_cleanup.model.dead_letters import DeadLetter, index_headers
from digest_cleanup.pipeline.messaging import BATCH_QUEUE, SWEEP_QUEUE
from digest_cleanup.pipeline.runtime import Runtime

#: What Flower shows instead of a batch's kwargs: never the keys themselves.
HIDDEN_KWARGS = "{...}"
#: The task names: stable, since messages in flight name them.
BATCH_TASK = "digest_cleanup.delete_batch"
SWEEP_TASK = "digest_cleanup.sweep"
TRIGGER_TASK = "digest_cleanup.trigger"


class CeleryDispatcher:
    """Sends through a Celery app's ``send_task``; labels each message for Flower."""

    def __init__(self, app: Any, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    def send_batch(
        self, payload: BatchPayload, *, countdown: float | None = None, task_id: str | None = None
    ) -> None:
        run = self.runtime.store.runs.find(payload.run_id)
        total = batch_total(run.fields if run else None, payload.seq)
        self.app.send_task(
            BATCH_TASK,
            kwargs=payload.to_message(),
            task_id=task_id or payload.batch_id,
            queue=BATCH_QUEUE,
            countdown=countdown,
            argsrepr=payload.describe(of=total),
            kwargsrepr=HIDDEN_KWARGS,
        )

    def send_sweep(self, run_id: str, *, countdown: float | None = None) -> None:
        self.app.send_task(SWEEP_TASK, args=[run_id], queue=SWEEP_QUEUE, countdown=countdown)

    def send_dead_letter(self, letter: DeadLetter) -> None:
        self.app.send_task(
            BATCH_TASK,
            kwargs=letter.body,
            task_id=letter.entry_id,
            queue=self.runtime.settings.dead_letter_queue,
            argsrepr=f"dead letter: {letter.label}" + self._console_link(letter.entry_id),
            kwargsrepr=HIDDEN_KWARGS,
            # What the dead-letter index files the entry under, readable without
            # decoding the body (see DeadLetterQueue.absorb).
            headers=index_headers(letter.body),
        )

    def _console_link(self, entry_id: str) -> str:
        """`` console: URL/dlq/ID`` with ``CLEANUP_CONSOLE_URL`` set: Flower links the entry."""
        base = self.runtime.settings.console_url
        return f" console: {base}/dlq/{quote(entry_id, safe='')}" if base else ""
