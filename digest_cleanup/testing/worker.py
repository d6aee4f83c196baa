"""A Celery worker for the pipeline's queues in a thread of the test process.

:func:`in_process_worker` is what :func:`~digest_cleanup.testing.pipeline.run_pipeline`
serves a run with; a test that drives the pipeline's tasks itself can use it too.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from celery.contrib.testing.worker import TestWorkController, test_worker_started
from kombu.asynchronous import get_event_loop, set_event_loop

from digest_cleanup.pipeline.messaging import BATCH_QUEUE, SWEEP_QUEUE

#: Seconds the in-process worker may take to start, and to stop once the run is over.
WORKER_TIMEOUT = 30.0


@contextlib.contextmanager
def in_process_worker(
    app: Any, timeout: float = WORKER_TIMEOUT, queues: Sequence[str] = (SWEEP_QUEUE, BATCH_QUEUE)
) -> Iterator[str]:
    """Run a worker for the pipeline's ``queues`` in a thread of this process; yield its name.

    It is ``celery.contrib.testing.worker.start_worker`` without the habits that
    break other in-process workers, such as a ``celery_session_worker`` in the same
    test session:

    * it stops only its own worker, with a remote-control shutdown sent to its
      name, where ``start_worker`` sets a process-wide flag that stops them all;
    * it gets an event loop of its own.  A worker takes kombu's process-wide loop
      if one is set, and two threads running one loop corrupt each other's state;
    * it makes its app the current one in its own thread only, not the process default;
    * it leaves the root logger, and so the test runner's log capture, alone.
    """
    app.conf.worker_hijack_root_logger = False
    app.finalize()
    with app.connection_for_write() as conn:  # an unreachable broker fails here, not in a thread
        conn.ensure_connection(max_retries=3)
    hostname = f"digest-cleanup-test-{uuid.uuid4().hex[:8]}@localhost"
    ready = threading.Event()

    def on_started(sender: Any, worker: Any, **_: Any) -> None:
        if worker.hostname == hostname:
            ready.set()

    test_worker_started.connect(on_started, sender=app, weak=False)
    worker = _worker(app, hostname, queues)

    def run() -> None:
        # Celery looks tasks up in the thread's current app (or the process default,
        # which another test worker may have claimed); make it this one, here only.
        app.set_current()
        worker.start()

    thread = threading.Thread(target=run, name=hostname, daemon=True)
    thread.start()
    try:
        if not ready.wait(timeout):
            raise RuntimeError(f"the in-process worker did not start within {timeout:.0f}s")
        yield hostname
    finally:
        test_worker_started.disconnect(on_started, sender=app)
        if thread.is_alive():
            app.control.shutdown(destination=[hostname])
            thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the in-process worker did not stop within {timeout:.0f}s")


def _worker(app: Any, hostname: str, queues: Sequence[str]) -> TestWorkController:
    """A solo worker for ``queues``, with an event loop of its own."""
    shared_loop = get_event_loop()
    set_event_loop(None)  # so the worker built below makes a loop of its own
    try:
        return TestWorkController(
            app=app,
            hostname=hostname,
            pool="solo",
            concurrency=1,
            queues=list(queues),
            loglevel="WARNING",
            logfile=None,
            ready_callback=None,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
    finally:
        set_event_loop(shared_loop)
