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

``between=`` runs code of the test after the sweep has published every batch and
before any batch runs, such as rewriting a listed key to take the kind's "changed
since listing" path end to end.  ``result.logs`` holds the lines the run logged,
scrubbed as a worker's are, to check that no key shows its customer part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import celery

from digest_cleanup.app import create_app
from digest_cleanup.clock import utcnow
from digest_cleanup.logs import JsonFormatter, SafeFormatter, Scrubber, item_prefixes
from digest_cleanup.model.run_view import RunView
from digest_cleanup.ops.progress import wait
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.messaging import SWEEP_QUEUE
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.store.runs import RunStore
from digest_cleanup.targets import Target, Targets, parse_targets
from digest_cleanup.testing.worker import in_process_worker

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
#: The credentials a run signs its S3 requests with unless the caller passes its own:
#: the test servers accept any, and real AWS accepts none of these.
TEST_CREDENTIALS: Mapping[str, str] = {
    "aws_access_key_id": "digest-cleanup-test",
    "aws_secret_access_key": "digest-cleanup-test-secret",
    "aws_region": "us-east-1",
}
#: How a line of ``PipelineResult.logs`` reads in the text format (before scrubbing).
LOG_FORMAT = "%(levelname)s %(name)s %(message)s"
#: Seconds between looks at the run store while waiting for the sweep to finish.
POLL_SECONDS = 0.05

#: What ``between=`` is called with: the run as ``status --json`` shows it then.
Between = Callable[[dict[str, Any]], object]


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
    #: Every line logged at INFO or above while the run went on (by the pipeline, the
    #: kind, Celery), scrubbed as a worker's log handler scrubs it: secrets masked,
    #: and each key found by its kind's ``log_prefixes`` with its customer part hashed.
    logs: Sequence[str] = ()

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
    between: Between | None = None,
    **settings: Any,
) -> PipelineResult:
    """Run ``target`` (default: the file's only target) to its end and return what it did.

    ``targets_toml`` is the text of a targets file.  ``env`` is what the kinds may
    read from :attr:`Settings.env`, such as the variable a ``dsn_env`` names.
    ``cutoff`` defaults to now minus the target's ``retention_days``.  Other
    keyword arguments are :class:`Settings` fields, over :data:`TEST_SETTINGS`.
    ``between`` is called once the sweep is done, every batch published and none
    run yet (or the run ended without any), with the run as ``status --json`` shows
    it; the batches run after it returns.  A run that talks to S3 needs
    ``s3_endpoint_url``; without it this raises :class:`ValueError` before anything
    starts.
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
        return _run(
            run_settings, targets, target, _Options(cutoff, dry_run, force, timeout), between
        )


@dataclasses.dataclass(frozen=True)
class _Options:
    cutoff: datetime | None
    dry_run: bool
    force: bool
    timeout: float


def _run(
    run_settings: Settings,
    targets: Targets,
    target: str,
    options: _Options,
    between: Between | None,
) -> PipelineResult:
    """Start the run, serve it with an in-process worker until it ends, and read it back.

    With ``between``, a first worker serves only the sweep; ``between`` runs once the
    sweep is done, and a second worker then serves the batches.
    """
    caller_app = celery.current_app._get_current_object()
    app = create_app(run_settings, targets)
    # A new Celery app makes itself this thread's current app; keep the caller's.
    caller_app.set_current()
    runtime: Runtime = app.digest_cleanup_runtime
    tgt = runtime.target(target)
    deadline = time.monotonic() + options.timeout
    try:
        with _captured_logs(run_settings, targets) as lines:
            if between is None:
                with in_process_worker(app):
                    run_id = _start(runtime, tgt, options)
                    view = _wait_for_end(runtime.store, run_id, deadline)
            else:
                with in_process_worker(app, queues=[SWEEP_QUEUE]):
                    run_id = _start(runtime, tgt, options)
                    swept = _wait_for_sweep(runtime.store, run_id, deadline)
                between(swept.as_dict())
                with in_process_worker(app):
                    view = _wait_for_end(runtime.store, run_id, deadline)
        run = view.as_dict() | {"failures_by_code": runtime.store.runs.retry_codes(run_id)}
        entries = [e.as_dict() for e in runtime.dead_letters.entries(run=run_id)]
        return PipelineResult(run=run, dead_letters=entries, settings=run_settings, logs=lines)
    finally:
        runtime.close()


def _start(runtime: Runtime, tgt: Target, options: _Options) -> str:
    """Start the run as ``digest-cleanup run`` does; its id."""
    return start(
        runtime,
        tgt,
        options.cutoff or tgt.cutoff_for(utcnow()),
        dry_run=options.dry_run,
        force=options.force,
        trigger="test",
    ).run_id


def _wait_for_sweep(store: RunStore, run_id: str, deadline: float) -> RunView:
    """The run once its sweep is done (every batch published), or once it has ended."""
    while True:
        view = store.runs.get(run_id)
        if view.finished or view.fields.get("sweep_done") == "1":
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id}: the sweep did not finish in time: {view.as_dict()}")
        time.sleep(POLL_SECONDS)


def _wait_for_end(store: RunStore, run_id: str, deadline: float) -> RunView:
    """The run once it has ended and its report is out; :class:`TimeoutError` past ``deadline``."""
    view = wait(store, run_id, show=False, timeout=max(0.0, deadline - time.monotonic()))
    if not (view.finished and view.fields.get("finalized_at")):
        raise TimeoutError(f"run {run_id} did not finish in time: {view.as_dict()}")
    return view


@contextlib.contextmanager
def _captured_logs(settings: Settings, targets: Targets) -> Iterator[list[str]]:
    """Collect every line logged at INFO or above meanwhile, scrubbed as a worker's are.

    A worker's handlers get :func:`digest_cleanup.logs.install`'s formatter; this
    handler gets the same one, from the same targets, so what it collects is what a
    worker would write.  The root logger is at INFO meanwhile, as in a worker.
    """
    lines: list[str] = []
    inner = JsonFormatter() if settings.log_format == "json" else logging.Formatter(LOG_FORMAT)
    formatter = SafeFormatter(inner, Scrubber(settings, item_prefixes(targets)))

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(formatter.format(record))

    root = logging.getLogger()
    handler, level = Collect(logging.INFO), root.level
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


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
