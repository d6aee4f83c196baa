"""One batch attempt as plain functions on a real Redis: what a refused batch may touch."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.kinds import Outcome
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.pipeline.batch import process
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import sweep_slice
from digest_cleanup.settings import Settings
from digest_cleanup.store.budget import DEFER_SECONDS
from digest_cleanup.targets import parse_targets
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
    before = runtime.store.runs.get(run_id)
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
    after = runtime.store.runs.get(run_id)
    for counter in ("inflight", "dead_lettered", "deleted", "batches_done"):
        assert after.count(counter) == before.count(counter), counter
    assert len(memory.contents("attempts")) == 100

    # And the same batch with the current token still deletes and counts as usual
    assert process(runtime, published[0].to_message(), "t2").deleted == 50
    assert runtime.store.runs.get(run_id).count("inflight") == 1


BUDGETED = TARGETS.replace("batch_size = 50", "batch_size = 50\ndelete_rate = 1000")


@pytest.fixture
def budgeted(redis_url: str) -> Iterator[Runtime]:
    memory.reset("attempts")
    memory.seed("attempts", {f"snap/{i:04d}": CUTOFF - timedelta(days=1) for i in range(100)})
    runtime = Runtime(Settings(broker_url=redis_url), parse_targets(BUDGETED))
    budget = runtime.budget("snapshots")
    assert budget is not None
    runtime.redis.delete(budget.key)  # the session's Redis may hold an earlier test's
    yield runtime
    runtime.close()
    memory.reset("attempts")


def _two_batches(runtime: Runtime) -> tuple[str, list[BatchPayload]]:
    published: list[BatchPayload] = []
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    assert sweep_slice(recording(runtime, published.append), run_id) == "done"
    return run_id, published


def test_a_batch_whose_budget_is_too_far_off_is_handed_back_as_the_same_attempt(budgeted):
    # Given a running run and a budget S3 paused for a minute
    run_id, published = _two_batches(budgeted)
    budget = budgeted.budget("snapshots")
    assert budget is not None
    budget.throttled(pause=60)
    dispatcher = RecordingDispatcher()
    budgeted.dispatcher = dispatcher

    # When a batch is delivered
    report = process(budgeted, published[0].to_message(), "t1")

    # Then it deletes nothing, and goes back as itself with a short countdown
    assert (report.status, report.reason) == ("deferred", "delete_budget")
    (sent,) = dispatcher.sent
    assert sent.payload == published[0]
    assert sent.task_id == "t1"
    assert sent.countdown is not None
    assert 0 < sent.countdown <= DEFER_SECONDS
    assert len(memory.contents("attempts")) == 100
    # And it spent no retry and counted no delivery: the next one is the first
    run = budgeted.store.runs.get(run_id)
    assert (run.count("retries"), run.count("inflight")) == (0, 2)
    assert budgeted.store.runs.count_delivery(run_id, published[0].claim) == 1
    assert budget.state().deferred == 1


def test_a_throttled_key_lowers_the_shared_rate_and_only_it_retries(budgeted):
    # Given a key S3 answers SlowDown for, once
    _run_id, published = _two_batches(budgeted)
    throttled = published[0].keys[7]
    memory.fail("attempts", throttled, Outcome.TRANSIENT, "SlowDown", times=1)
    dispatcher = RecordingDispatcher()
    budgeted.dispatcher = dispatcher

    # When its batch is deleted
    report = process(budgeted, published[0].to_message(), "t1")

    # Then the others are gone, that key alone retries, and the budget's rate fell
    assert (report.deleted, report.retrying) == (49, 1)
    assert [s.payload.keys for s in dispatcher.sent] == [[throttled]]
    state = budgeted.budget("snapshots").state()  # type: ignore[union-attr]
    assert state.throttles == 1
    assert state.rate < state.ceiling
    # And a key that fails otherwise lowers nothing
    memory.fail("attempts", published[1].keys[0], Outcome.TRANSIENT, "InternalError", times=1)
    process(budgeted, published[1].to_message(), "t2")
    assert budgeted.budget("snapshots").state().throttles == 1  # type: ignore[union-attr]


def test_a_target_without_a_budget_draws_nothing(runtime):
    assert runtime.budget("snapshots") is None


def test_each_recorded_attempt_leaves_one_progress_sample_and_a_duplicate_none(runtime):
    # Given a running run with two batches in flight
    published: list[BatchPayload] = []
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    assert sweep_slice(recording(runtime, published.append), run_id) == "done"
    runtime.dispatcher = RecordingDispatcher()

    # When both are deleted, and the first is delivered again
    for n, payload in enumerate([*published, published[0]]):
        process(runtime, payload.to_message(), f"t{n}")

    # Then the chart has one sample per recorded attempt, with the counts it left
    samples = runtime.store.runs.progress(run_id)
    assert [(deleted, done) for _, deleted, done in samples] == [(50, 50), (100, 100)]
    assert samples[0][0] <= samples[1][0]
