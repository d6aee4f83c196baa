"""The abort action: a running run ends failed with an audit record; any other is left alone.

Real Redis, the memory kind; the CLI's ``abort`` is a thin caller of the same
function (see ``tests/e2e/test_abort.py`` for it end to end).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.errors import RunStateError
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.ops.abort import abort_run
from digest_cleanup.pipeline.batch import process
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import sweep_slice
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing import memory
from digest_cleanup.testing.dispatcher import RecordingDispatcher, recording

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
OLD = CUTOFF - timedelta(days=1)
TARGETS = """
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "aborted"
prefix = "snap/"
retention_days = 0
schedule = "0 3 * * 0"
batch_size = 50
"""
COMMAND = "digest-cleanup abort RUN --reason test --yes"


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    memory.reset("aborted")
    memory.seed("aborted", {f"snap/{i:04d}": OLD for i in range(100)})
    runtime = Runtime(Settings(broker_url=redis_url), parse_targets(TARGETS))
    yield runtime
    runtime.close()
    memory.reset("aborted")


def _swept(rt: Runtime) -> tuple[str, list[BatchPayload]]:
    """A run whose two batches were published and wait, undelivered."""
    published: list[BatchPayload] = []
    run_id = start(recording(rt), rt.target("snapshots"), CUTOFF).run_id
    assert sweep_slice(recording(rt, published.append), run_id) == "done"
    return run_id, published


def test_aborting_a_running_run_fails_it_and_keeps_an_audit_record(rt):
    # Given a run with its batches in flight
    run_id, _batches = _swept(rt)
    assert rt.store.runs.get(run_id).status == "running"

    # When an operator aborts it
    result = abort_run(rt, run_id, "batches worker gone", COMMAND)

    # Then it is failed as aborted, saying why, and the audit log holds the run as it was
    run = rt.store.runs.get(run_id).as_dict()
    assert (run["status"], run["reason"]) == ("failed", "aborted")
    assert "batches worker gone" in run["message"]
    assert result.run["status"] == "failed"
    (record,) = rt.dead_letters.audit_log()
    assert record == result.record
    assert (record["action"], record["reason"], record["command"]) == (
        "abort",
        "batches worker gone",
        COMMAND,
    )
    assert record["run"]["status"] == "running"
    # and with no audit location set, nothing was kept beyond Redis
    assert result.audit_url is None
    assert result.as_dict()["audit_record"] == record


def test_aborting_a_finished_run_is_refused_and_records_nothing(rt):
    # Given a run that completed
    run_id, batches = _swept(rt)
    rt.dispatcher = RecordingDispatcher()
    for n, payload in enumerate(batches):
        process(rt, payload.to_message(), f"t{n}")
    assert rt.store.runs.get(run_id).status == "complete"

    # When an operator aborts it
    with pytest.raises(RunStateError, match="is complete, not running: nothing to abort"):
        abort_run(rt, run_id, "too late", COMMAND)

    # Then it stays complete, and no audit record was written
    assert rt.store.runs.get(run_id).status == "complete"
    assert rt.dead_letters.audit_log() == []
