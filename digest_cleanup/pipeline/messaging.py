"""What the pipeline sends, and the one seam it sends through.

The pipeline never imports Celery.  Every message it sends (a batch, a batch's
retry, a dead letter, a sweep slice) goes through the :class:`Dispatcher` its
:class:`~digest_cleanup.pipeline.runtime.Runtime` carries.  The worker wiring
implements it on Celery (:mod:`digest_cleanup.tasks.dispatch`); tests use
:class:`digest_cleanup.testing.dispatcher.RecordingDispatcher`.

The queue names live here, below everything that needs them, so nothing reaches
up into the Celery app for one.
"""

from __future__ import annotations

from typing import Protocol

from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.model.dead_letters import DeadLetter

#: Queue of sweep slices and beat triggers.
SWEEP_QUEUE = "sweeps"
#: Queue of batch deletes.
BATCH_QUEUE = "batches"


class Dispatcher(Protocol):
    """Sends what the pipeline asks for; delivery is at least once."""

    def send_batch(
        self, payload: BatchPayload, *, countdown: float | None = None, task_id: str | None = None
    ) -> None:
        """Send a batch (``task_id`` defaults to its batch id; a retry keeps its task's id)."""

    def send_sweep(self, run_id: str, *, countdown: float | None = None) -> None:
        """Send the next sweep slice of ``run_id``."""

    def send_dead_letter(self, letter: DeadLetter) -> None:
        """Send a dead-letter entry to the dead-letter queue."""
