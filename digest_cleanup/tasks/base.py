"""The base task: access to the runtime its app carries."""

from __future__ import annotations

from celery import Task

from digest_cleanup.app import runtime_of
from digest_cleanup.errors import CleanupError
from digest_cleanup.pipeline.runtime import Runtime


class DeadLettered(CleanupError):
    """Raised after a batch was dead-lettered, so Flower shows it failed and names the entry."""


class CleanupTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Shared by every digest-cleanup task."""

    #: Expected outcomes, logged in one line instead of a traceback.
    throws = (DeadLettered,)

    @property
    def runtime(self) -> Runtime:
        return runtime_of(self.app)
