"""The suite's process stack: the demo's workers and CLI, and Celery beat.

Used by the end-to-end tests, the benchmarks and the reliability suite.
:class:`Stack` is the demo's (:class:`digest_cleanup.demo.stack.Stack`) with
:meth:`Stack.beat` added; the other names are the demo's too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from digest_cleanup.demo import stack as demo_stack
from digest_cleanup.demo.stack import READY_TIMEOUT, CliResult, Process, wait_for

__all__ = ["READY_TIMEOUT", "CliResult", "Process", "Stack", "wait_for"]


class Stack(demo_stack.Stack):
    """Starts digest-cleanup processes, beat included, wired to one Redis and one S3."""

    def beat(
        self,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "beat",
        schedule: Path | None = None,
        extra: Sequence[str] = (),
    ) -> Process:
        """Start ``celery -A digest_cleanup beat``; pass ``schedule`` again to restart a beat."""
        schedule = schedule or self.workdir / f"{name}-{self._count + 1}-schedule"
        argv = [
            self.executable("celery"),
            "-A",
            "digest_cleanup",
            "beat",
            "--loglevel=INFO",
            f"--schedule={schedule}",
            *extra,
        ]
        return self.start(name, argv, env)
