"""Run one target through the real pipeline, in-process, for a kind's tests.

:func:`run_pipeline` starts the run exactly as ``digest-cleanup run`` does, and
an in-process Celery worker (Celery's own test worker, in a thread) consumes the
project's own tasks on a real Redis: the guard pass, the sliced sweep, the
batches, retries with backoff, dead letters and the run's accounting.  Only the
kind under test is yours::

    result = run_pipeline(TARGETS, redis_url="redis://127.0.0.1:6379/5", cutoff=cutoff)
    assert result.run["status"] == "complete"
    assert result.run["deleted"] == 300
    assert result.dead_letters == []

Give it a Redis database of its own: the worker consumes the pipeline's
``sweeps`` and ``batches`` queues there.  Each call keeps its run state and
dead letters under a fresh key prefix and queue name, so calls do not see each
other's.  A run that talks to S3 (an S3 target, or an ``audit_url``) needs
``s3_endpoint_url=`` too: the helper never falls back to AWS, and never signs
with the credentials, profile or endpoint of the shell it runs in (``AWS_*``,
``~/.aws``), only with test credentials of its own.  The fixtures in
:mod:`digest_cleanup.testing.plugin` wrap it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import celery
from celery.contrib.testing.worker import TestWorkController, test_worker_started
from kombu.asynchronous import get_event_loop, set_event_loop

from digest_cleanup.app import create_app
from digest_cleanup.clock import utcnow
from digest_cleanup.config.settings import Settings
from digest_cleanup.config.targets import Targets, parse_targets
from digest_cleanup.ops.progress import wait
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.messaging import BATCH_QUEUE, SWEEP_QUEUE
from digest_cleanup.pipeline.runtime import Runtime

#: Seconds a run may take before :func:`run_pipeline` gives up waiting.
DEFAULT_TIMEOUT = 120.0
#: Settings for a quick test run: retries after tens of milliseconds, not seconds.
#: Keyword arguments of :func:`run_pipeline` override any of them.
TEST_SETTINGS: Mapping[str, Any] = {
    "visibility_timeout": 60,
    "retry_base": 0.05,
    "retry_cap": 0.5,
    "max_retries": 3,
}
#: Seconds the in-process worker may take to start, and to stop once the run is over.
WORKER_TIMEOUT = 30.0
#: The credentials a run signs its S3 requests with unless the caller passes its own:
#: the test servers accept any, and real AWS accepts none of these.
TEST_CREDENTIALS: Mapping[str, str] = {
    "aws_access_key_id": "digest-cleanup-test",
    "aws_secret_access_key": "digest-cleanup-test-secret",
    "aws_region": "us-east-1",
}


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """What one run did, read back from the run store."""

    #: The run as ``digest-cleanup status RUN --json`` shows it (``status``,
    #: ``expired``, ``deleted``, ``dead_lettered``, ``skipped``, ``failures_by_code``...).
    run: dict[str, Any]
    #: This run's dead-letter entries as ``digest-cleanup dlq list --json`` shows them.
    dead_letters: list[dict[str, Any]]
    #: The settings the run used (its key prefix and dead-letter queue are its own).
    settings: Settings

    @property
    def dead_letter_codes(self) -> dict[str, str]:
        """Each dead-lettered key with its error code."""
        return {k["key"]: k["code"] for entry in self.dead_letters for k in entry["keys"]}


def run_pipeline(
    targets_toml: str,
    target: str | None = None,
    *,
    redis_url: str,
    cutoff: datetime | None = None,
    env: Mapping[str, str] | None = None,
    dry_run: bool = False,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    **settings: Any,
) -> PipelineResult:
    """Run ``target`` (default: the file's only target) to its end and return what it did.

    ``targets_toml`` is the text of a targets file.  ``env`` is what the kinds may
    read from :attr:`Settings.env`, such as the variable a ``dsn_env`` names.
    ``cutoff`` defaults to now minus the target's ``retention_days``.  Other
    keyword arguments are :class:`Settings` fields, over :data:`TEST_SETTINGS`.
    A run that talks to S3 needs ``s3_endpoint_url``; without it this raises
    :class:`ValueError` before anything starts.
    Raises :class:`TimeoutError` if the run has not finished within ``timeout``.
    """
    targets = parse_targets(targets_toml, Path("<run_pipeline>"))
    if target is None:
        if len(targets) != 1:
            raise ValueError(f"the targets define {sorted(targets.by_name)}; say which to run")
        target = next(iter(targets)).name
    run_settings = _run_settings(redis_url, env, settings)
    if not run_settings.s3_endpoint_url and (
        targets.get(target).kind == "s3" or run_settings.audit_url
    ):
        raise ValueError(
            f"run_pipeline would send target {target!r}'s requests to AWS itself: pass "
            "s3_endpoint_url= the S3 server the test started (for example "
            "s3_endpoint_url=weed.endpoint_url); the helper never falls back to AWS"
        )
    with _without_ambient_aws():
        return _run(run_settings, targets, target, cutoff, dry_run, force, timeout)


def _run(
    run_settings: Settings,
    targets: Targets,
    target: str,
    cutoff: datetime | None,
    dry_run: bool,
    force: bool,
    timeout: float,
) -> PipelineResult:
    """Start the run, serve it with an in-process worker until it ends, and read it back."""
    caller_app = celery.current_app._get_current_object()
    app = create_app(run_settings, targets)
    # A new Celery app makes itself this thread's current app; keep the caller's.
    caller_app.set_current()
    runtime: Runtime = app.digest_cleanup_runtime
    tgt = runtime.target(target)
    try:
        with in_process_worker(app):
            started = start(
                runtime,
                tgt,
                cutoff or tgt.cutoff_for(utcnow()),
                dry_run=dry_run,
                force=force,
                trigger="test",
            )
            view = wait(runtime.store, started.run_id, show=False, timeout=timeout)
            if not (view.finished and view.fields.get("finalized_at")):
                raise TimeoutError(
                    f"run {started.run_id} did not finish within {timeout:.0f}s: {view.as_dict()}"
                )
        run = view.as_dict() | {"failures_by_code": runtime.store.retry_codes(started.run_id)}
        entries = [e.as_dict() for e in runtime.dead_letters.entries(run=started.run_id)]
        return PipelineResult(run=run, dead_letters=entries, settings=run_settings)
    finally:
        runtime.close()


def _run_settings(
    redis_url: str, env: Mapping[str, str] | None, overrides: Mapping[str, Any]
) -> Settings:
    """:data:`TEST_SETTINGS` with keys and a dead-letter queue of this run's own."""
    tag = uuid.uuid4().hex[:12]
    return Settings(
        **{
            **TEST_SETTINGS,
            **TEST_CREDENTIALS,
            "broker_url": redis_url,
            "key_prefix": f"dctest-{tag}",
            "dead_letter_queue": f"dead_letter-{tag}",
            "env": dict(env or {}),
            **overrides,
        }
    )


@contextlib.contextmanager
def _without_ambient_aws() -> Iterator[None]:
    """Hide the shell's ``AWS_*`` variables and ``~/.aws`` files while a run goes on.

    The worker runs in this process, and botocore reads the process's environment and
    shared files itself: a profile there (``AWS_PROFILE``) or an endpoint
    (``AWS_ENDPOINT_URL``) would apply to the test's requests, as ``Stack`` keeps them
    from applying to its processes.  Everything is put back afterwards.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    for name in saved:
        del os.environ[name]
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    try:
        yield
    finally:
        for name in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[name]
        os.environ.update(saved)


@contextlib.contextmanager
def in_process_worker(app: Any, timeout: float = WORKER_TIMEOUT) -> Iterator[str]:
    """Run a worker for the pipeline's queues in a thread of this process; yield its name.

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
    worker = _worker(app, hostname)

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


def _worker(app: Any, hostname: str) -> TestWorkController:
    """A solo worker for the pipeline's queues, with an event loop of its own."""
    shared_loop = get_event_loop()
    set_event_loop(None)  # so the worker built below makes a loop of its own
    try:
        return TestWorkController(
            app=app,
            hostname=hostname,
            pool="solo",
            concurrency=1,
            queues=[SWEEP_QUEUE, BATCH_QUEUE],
            loglevel="WARNING",
            logfile=None,
            ready_callback=None,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
    finally:
        set_event_loop(shared_loop)
