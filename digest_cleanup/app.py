"""The Celery app, configured for safe at-least-once deletes on Redis."""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery, signals
from kombu.entity import Queue

from digest_cleanup import broker
from digest_cleanup.pipeline.messaging import BATCH_QUEUE, SWEEP_QUEUE
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import DEFAULT_WORKER_THREADS, Settings
from digest_cleanup.targets import Targets
from digest_cleanup.tasks.dispatch import BATCH_TASK, SWEEP_TASK, TRIGGER_TASK, CeleryDispatcher

#: Seconds between kombu's scans for unacknowledged messages past their
#: visibility timeout.  The default (10 s, and a scan on only every 10th tick)
#: leaves a killed worker's batch waiting ~100 s longer than it must.
UNACKED_RESTORE_INTERVAL = 5

TASKS = ("digest_cleanup.tasks.sweep", "digest_cleanup.tasks.batch")


def create_app(
    settings: Settings | None = None,
    targets: Targets | None = None,
    *,
    runtime: Runtime | None = None,
) -> Celery:
    """Build the app; ``celery -A digest_cleanup`` uses :func:`default_app`.

    The app carries its :class:`Runtime` (a given one, or a new one), with a
    :class:`CeleryDispatcher` installed, so everything the pipeline sends goes
    through this app.  It is long because it is the whole Celery configuration in
    one place, each setting beside its reason.
    """
    if runtime is not None:
        settings = runtime.settings
    settings = settings or Settings.from_env()
    app = Celery("digest_cleanup", include=list(TASKS))
    app.conf.update(
        broker_url=settings.broker_url,
        # JSON only: a pickle message is refused before anything deserializes it.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        # Progress lives in the run store, so no result backend is needed.
        task_ignore_result=True,
        # Acknowledge after the work: a worker that dies mid-batch leaves the
        # message to be delivered again (deletes are idempotent).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # One message per process at a time, so a slow batch does not hold others hostage.
        worker_prefetch_multiplier=1,
        # A plain `celery -A digest_cleanup worker` is the fast layout: threads, many
        # deletes in flight (CLEANUP_WORKER_POOL picks another pool; --concurrency wins).
        worker_pool=settings.worker_pool,
        worker_concurrency=DEFAULT_WORKER_THREADS if settings.worker_pool == "threads" else None,
        # Flower needs events to show tasks.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_queues=(Queue(SWEEP_QUEUE), Queue(BATCH_QUEUE)),  # type: ignore[no-untyped-call]
        task_default_queue=BATCH_QUEUE,
        task_routes={
            SWEEP_TASK: {"queue": SWEEP_QUEUE},
            TRIGGER_TASK: {"queue": SWEEP_QUEUE},
            BATCH_TASK: {"queue": BATCH_QUEUE},
        },
        broker_transport_options={
            # The visibility timeout bounds how long a batch held by a dead
            # worker waits.  Every retry countdown is clamped below half of it
            # (Settings.effective_retry_cap): an ETA message held past the
            # timeout is restored by Redis and would run twice.
            "visibility_timeout": settings.visibility_timeout,
            "unacked_restore_interval": min(UNACKED_RESTORE_INTERVAL, settings.visibility_timeout),
            "unacked_restore_throttle": 1,
        },
        # rediss:// verifies the server's certificate, as the run store's client does.
        broker_use_ssl=broker.ssl_options(settings.broker_url),
        # A worker checks the broker itself before starting (see _check_broker); a
        # connection lost later is retried by Celery.
        broker_connection_retry_on_startup=True,
        # A task whose connection dropped cannot acknowledge; stop it rather
        # than let it finish and have its message delivered again anyway.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        timezone="UTC",
        enable_utc=True,
        beat_max_loop_interval=30,
    )
    runtime = runtime or Runtime(settings, targets)
    runtime.dispatcher = CeleryDispatcher(app, runtime)
    app.digest_cleanup_runtime = runtime
    return app


def runtime_of(app: Any) -> Runtime:
    """The :class:`Runtime` an app carries (built lazily for the default app)."""
    runtime = getattr(app, "digest_cleanup_runtime", None)
    if runtime is None:
        runtime = Runtime(Settings.from_env())
        runtime.dispatcher = CeleryDispatcher(app, runtime)
        app.digest_cleanup_runtime = runtime
    return runtime


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # Pool children inherit the parent's runtime; sockets must not cross a fork.
    # The solo pool sends this too, from the one process that runs its tasks.
    from celery import current_app

    runtime = getattr(current_app, "digest_cleanup_runtime", None)
    if runtime is not None:
        runtime.after_fork()
        runtime.prepare()


@signals.worker_ready.connect
def _prepare_in_main_process(sender: Any = None, **_: Any) -> None:
    # The threads, gevent and eventlet pools run tasks in the main process, which
    # no worker_process_init reaches; prefork runs none there, so builds nothing.
    from celery.concurrency.prefork import TaskPool as PreforkPool

    runtime = getattr(getattr(sender, "app", None), "digest_cleanup_runtime", None)
    if runtime is None or isinstance(getattr(sender, "pool", None), PreforkPool):
        return
    runtime.prepare()


@signals.worker_init.connect
@signals.beat_init.connect
def _check_broker(sender: Any = None, **_: Any) -> None:
    # Celery would retry an unreachable broker for ever, an error line every few
    # seconds; exit with one line instead and let the supervisor restart us.
    runtime = getattr(getattr(sender, "app", None), "digest_cleanup_runtime", None)
    if runtime is None:  # not a digest-cleanup app (an embedded test worker, say)
        return
    problem = broker.unreachable(runtime.settings)
    if problem is not None:
        print(f"digest-cleanup: error: {problem}", file=sys.stderr)
        raise SystemExit(2)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _setup_logging(logger: logging.Logger, **_: Any) -> None:
    from celery import current_app

    from digest_cleanup.errors import ConfigError
    from digest_cleanup.logs import install, item_prefixes

    runtime = runtime_of(current_app)
    try:
        prefixes = item_prefixes(runtime.targets)
    except ConfigError:
        prefixes = []  # the worker stops on the same error with a clearer message
    install(logger, runtime.settings, prefixes)
