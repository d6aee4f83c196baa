"""One batch attempt as plain functions on a real Redis: what a refused batch may touch."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.config.settings import Settings
from digest_cleanup.config.targets import parse_targets
from digest_cleanup.pipeline.attempts import process
from digest_cleanup.pipeline.batches import BatchPayload
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import sweep_slice
from digest_cleanup.testing import memory
from digest_cleanup.testing.dispatcher import RecordingDispatcher, recording

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
TARGETS = """
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "attempts"
prefix = "snap/"
retention_days = 0
schedule = "0 3 * * 0"
batch_size = 50
"""


@pytest.fixture
def runtime(redis_url: str) -> Iterator[Runtime]:
    memory.reset("attempts")
    memory.seed("attempts", {f"snap/{i:04d}": CUTOFF - timedelta(days=1) for i in range(100)})
    runtime = Runtime(Settings(broker_url=redis_url), parse_targets(TARGETS))
    yield runtime
    runtime.close()
    memory.reset("attempts")


def test_a_batch_of_an_earlier_incarnation_leaves_the_current_runs_counters_alone(runtime):
    # Given a running run whose two batches are in flight
    published: list[BatchPayload] = []
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    assert sweep_slice(recording(runtime, published.append), run_id) == "done"
    before = runtime.store.get(run_id)
    assert before.count("inflight") == 2

    # When a batch with the same id but an earlier incarnation's token is delivered
    stale = BatchPayload(**{**published[0].__dict__, "run_token": "an-earlier-incarnation"})
    dispatcher = RecordingDispatcher()
    runtime.dispatcher = dispatcher
    report = process(runtime, stale.to_message(), "t1")

    # Then it is dead-lettered whole, deletes nothing, and counts nothing in this run
    assert (report.status, report.reason) == ("dead_lettered", "stale_run")
    (entry,) = dispatcher.dead.values()
    assert len(BatchPayload.from_message(entry.body).keys) == 50
    after = runtime.store.get(run_id)
    for counter in ("inflight", "dead_lettered", "deleted", "batches_done"):
        assert after.count(counter) == before.count(counter), counter
    assert len(memory.contents("attempts")) == 100

    # And the same batch with the current token still deletes and counts as usual
    assert process(runtime, published[0].to_message(), "t2").deleted == 50
    assert runtime.store.get(run_id).count("inflight") == 1
