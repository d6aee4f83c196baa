"""Task tier: the real Celery tasks in pytest-celery's in-process worker, on a real Redis.

The in-memory kind stands behind the seam, so these tests exercise sweep
slicing, fan-out, retries, dead letters and run accounting without S3.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from digest_cleanup.app import create_app
from digest_cleanup.kinds import Outcome
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets
from digest_cleanup.tasks.dispatch import CeleryDispatcher
from digest_cleanup.testing import memory
from digest_cleanup.testing.dispatcher import RecordingDispatcher
from tests.rig.servers import RedisServer
from tests.rig.stack import wait_for

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
OLD = CUTOFF - timedelta(days=3)
NEW = CUTOFF + timedelta(hours=1)

TARGETS = """
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "tasks"
prefix = "snap/"
retention_days = 0
schedule = "0 3 * * 0"
batch_size = 50
max_delete = 1000
"""


@pytest.fixture(scope="session")
def settings(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    path: Path = tmp_path_factory.mktemp("targets") / "targets.toml"
    path.write_text(TARGETS)
    return Settings(
        broker_url=redis_server.url.replace("/0", "/3"),
        targets_file=path,
        visibility_timeout=20,
        retry_base=0.05,
        retry_cap=0.2,
        max_retries=3,
        key_prefix="dctask",
    )


@pytest.fixture(scope="session")
def celery_config(settings: Settings) -> dict[str, Any]:
    conf = create_app(settings).conf
    keys = (
        "broker_url",
        "task_serializer",
        "accept_content",
        "task_acks_late",
        "task_queues",
        "task_default_queue",
        "task_routes",
        "worker_prefetch_multiplier",
        "broker_transport_options",
        "task_ignore_result",
        "task_reject_on_worker_lost",
    )
    return {k: conf[k] for k in keys} | {"result_backend": "cache+memory://"}


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {"perform_ping_check": False, "queues": ("sweeps", "batches"), "concurrency": 1}


@pytest.fixture(scope="session")
def celery_includes() -> list[str]:
    return ["digest_cleanup.tasks.sweep", "digest_cleanup.tasks.batch"]


@pytest.fixture
def runtime(
    celery_session_app: Any, celery_session_worker: Any, settings: Settings
) -> Iterator[Runtime]:
    runtime = Runtime(settings, parse_targets(TARGETS))
    runtime.dispatcher = CeleryDispatcher(celery_session_app, runtime)
    client = redis.Redis.from_url(settings.broker_url)
    for key in client.scan_iter("dctask:*"):
        client.delete(key)
    client.delete(settings.dead_letter_queue)
    celery_session_app.digest_cleanup_runtime = runtime
    memory.reset("tasks")
    yield runtime
    memory.reset("tasks")


def _run(runtime: Runtime, app: Any, **kwargs: Any) -> dict[str, Any]:
    target = runtime.target("snapshots")
    started = start(runtime, target, CUTOFF, **kwargs)
    run = wait_for(
        lambda: (r := runtime.store.runs.get(started.run_id)).finished and r, 30, "run to finish"
    )
    return dict(run.as_dict())


def test_sweep_fans_out_batches_and_counts_every_item_once(runtime, celery_session_app):
    # Given 230 expired and 40 fresh items, plus old items outside the prefix
    memory.seed("tasks", {f"snap/{i:04d}": OLD for i in range(230)})
    memory.seed("tasks", {f"snap/n{i:04d}": NEW for i in range(40)})
    memory.seed("tasks", {f"other/{i:04d}": OLD for i in range(10)})

    # When a run is started
    run = _run(runtime, celery_session_app)

    # Then five batches of at most 50 delete exactly the expired items
    assert run["status"] == "complete"
    assert (run["listed"], run["expired"], run["batches"], run["deleted"]) == (270, 230, 5, 230)
    left = memory.contents("tasks")
    assert sorted(left) == sorted(
        [f"snap/n{i:04d}" for i in range(40)] + [f"other/{i:04d}" for i in range(10)]
    )
    assert max(memory.DELETE_CALLS["tasks"].values()) == 1


def test_transient_failures_retry_then_succeed(runtime, celery_session_app):
    # Given an item that fails twice with a throttling error
    memory.seed("tasks", {f"snap/{i:04d}": OLD for i in range(60)})
    memory.fail("tasks", "snap/0007", Outcome.TRANSIENT, "SlowDown", times=2)

    run = _run(runtime, celery_session_app)

    # Then it is retried (only that item) and the run completes
    assert run["status"] == "complete"
    assert run["deleted"] == 60
    assert run["retries"] == 2
    assert memory.DELETE_CALLS["tasks"]["snap/0007"] == 3
    assert memory.DELETE_CALLS["tasks"]["snap/0008"] == 1
    assert runtime.store.runs.retry_codes(run["run_id"]) == {"SlowDown": 2}


def test_exhausted_and_permanent_failures_are_dead_lettered(runtime, celery_session_app):
    # Given one item that always throttles and one that is denied
    memory.seed("tasks", {f"snap/{i:04d}": OLD for i in range(20)})
    memory.fail("tasks", "snap/0001", Outcome.TRANSIENT, "SlowDown")
    memory.fail("tasks", "snap/0002", Outcome.PERMANENT, "AccessDenied")

    run = _run(runtime, celery_session_app)

    # Then both end in the dead-letter queue with their codes, the rest deleted
    assert run["status"] == "complete_with_failures"
    assert (run["deleted"], run["dead_lettered"]) == (18, 2)
    entries = runtime.dead_letters.entries()
    codes = {
        k["key"]: (k["code"], e.as_dict()["reason"]) for e in entries for k in e.as_dict()["keys"]
    }
    assert codes == {
        "snap/0001": ("SlowDown", "retries_exhausted"),
        "snap/0002": ("AccessDenied", "permanent_error"),
    }
    # the permanent one was never retried; the transient one used every retry
    assert memory.DELETE_CALLS["tasks"]["snap/0002"] == 1
    assert memory.DELETE_CALLS["tasks"]["snap/0001"] == 4


def test_item_rewritten_after_the_sweep_is_skipped_not_deleted(runtime, celery_session_app):
    # Given an item the kind reports as no longer expired when the batch runs
    memory.seed("tasks", {f"snap/{i:04d}": OLD for i in range(10)})
    original = memory.MemoryKind.delete

    def rewrite_then_delete(self: Any, keys: Any, cutoff: datetime, conditions: Any = ()) -> Any:
        memory.seed("tasks", {"snap/0003": NEW})
        return original(self, keys, cutoff, conditions)

    memory.MemoryKind.delete = rewrite_then_delete  # type: ignore[method-assign]
    try:
        run = _run(runtime, celery_session_app)
    finally:
        memory.MemoryKind.delete = original  # type: ignore[method-assign]

    # Then the accounting identity holds with one item skipped
    assert run["status"] == "complete"
    assert (run["expired"], run["deleted"], run["skipped"]) == (10, 9, 1)
    assert "snap/0003" in memory.contents("tasks")


def test_max_delete_guard_refuses_the_run_and_deletes_nothing(runtime, celery_session_app):
    # Given more expired items than the target's max_delete (1000)
    memory.seed("tasks", {f"snap/{i:05d}": OLD for i in range(1001)})

    run = _run(runtime, celery_session_app)

    # Then the run fails before publishing a single batch
    assert run["status"] == "failed"
    assert run["reason"] == "max_delete_exceeded"
    assert "--force" in run["message"]
    assert run["batches"] == 0
    assert len(memory.contents("tasks")) == 1001
    assert "tasks" not in memory.DELETE_CALLS


def test_forced_run_passes_the_guard(runtime, celery_session_app):
    memory.seed("tasks", {f"snap/{i:05d}": OLD for i in range(1001)})

    run = _run(runtime, celery_session_app, force=True)

    assert run["status"] == "complete"
    assert run["deleted"] == 1001


def test_dry_run_counts_and_samples_without_deleting(runtime, celery_session_app):
    memory.seed("tasks", {f"snap/{i:04d}": OLD for i in range(75)})

    run = _run(runtime, celery_session_app, dry_run=True)

    assert run["status"] == "complete"
    assert run["dry_run"] is True
    assert run["expired"] == 75
    assert run["sample"] == [f"snap/{i:04d}" for i in range(20)]
    assert run["run_id"].endswith("-dry")
    assert len(memory.contents("tasks")) == 75


def test_second_trigger_attaches_instead_of_fanning_out_again(runtime, celery_session_app):
    memory.seed("tasks", {f"snap/{i:04d}": OLD for i in range(120)})
    target = runtime.target("snapshots")
    dispatcher = RecordingDispatcher()
    runtime.dispatcher = dispatcher

    first = start(runtime, target, CUTOFF)
    second = start(runtime, target, CUTOFF)

    assert first.action == "created"
    assert second.action == "attached"
    assert second.run_id == first.run_id
    assert dispatcher.sweeps == [(first.run_id, None)]
