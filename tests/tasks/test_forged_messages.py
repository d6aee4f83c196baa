"""Messages the run store cannot vouch for move no counter, end no batch, delete nothing.

Each test copies a real batch of a real run (real Redis, the memory kind) and
changes what someone who can read and write the broker could change: the keys,
the attempt, the generation, the dead-letter record.  Found in a review of the
batch-authority work; each failed on the code before its fix.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.app import create_app
from digest_cleanup.kinds import Outcome
from digest_cleanup.model.batches import BatchPayload, BatchRecord
from digest_cleanup.model.dead_letters import DeadLetter
from digest_cleanup.ops.redrive import redrive_entries
from digest_cleanup.pipeline.batch import process
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import sweep_slice
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets
from digest_cleanup.tasks.dispatch import CeleryDispatcher
from digest_cleanup.testing import memory
from digest_cleanup.testing.dispatcher import RecordingDispatcher, recording

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
OLD = CUTOFF - timedelta(days=1)
TARGETS = """
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "forged"
prefix = "snap/"
retention_days = 0
schedule = "0 3 * * 0"
batch_size = 50
"""


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    memory.reset("forged")
    memory.seed("forged", {f"snap/{i:04d}": OLD for i in range(100)})
    runtime = Runtime(Settings(broker_url=redis_url, max_retries=2), parse_targets(TARGETS))
    yield runtime
    runtime.close()
    memory.reset("forged")


class _ToTheQueue(RecordingDispatcher):
    """Records everything, and also sends dead letters to Redis, as a worker does."""

    def __init__(self, celery: CeleryDispatcher) -> None:
        super().__init__()
        self.celery = celery

    def send_dead_letter(self, letter: DeadLetter) -> None:
        super().send_dead_letter(letter)
        self.celery.send_dead_letter(letter)


def _started(rt: Runtime) -> tuple[str, list[BatchPayload]]:
    published: list[BatchPayload] = []
    run_id = start(recording(rt), rt.target("snapshots"), CUTOFF).run_id
    assert sweep_slice(recording(rt, published.append), run_id) == "done"
    return run_id, published


def _queued(rt: Runtime, redis_url: str) -> _ToTheQueue:
    dispatcher = _ToTheQueue(CeleryDispatcher(create_app(Settings(broker_url=redis_url)), rt))
    rt.dispatcher = dispatcher
    return dispatcher


def _next_work(rt: Runtime) -> tuple[dict[str, Any], str]:
    message = json.loads(rt.store.redis.rpop("batches"))
    _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    return kwargs, message["headers"]["id"]


def test_a_copy_without_keys_is_poison_and_leaves_the_real_batch_in_flight(rt):
    # Given a run with two batches in flight
    run_id, (first, second) = _started(rt)
    rt.dispatcher = RecordingDispatcher()

    # When a copy of the first with no keys and an unused attempt arrives, then the real ones
    forged = dataclasses.replace(first, keys=[], conditions=[], attempt=7)
    report = process(rt, forged.to_message(), "forged")
    process(rt, first.to_message(), "real-1")
    process(rt, second.to_message(), "real-2")

    # Then the copy was poison and counted nowhere, and the real batches deleted everything
    assert report.status == "poison"
    run = rt.store.runs.get(run_id)
    assert (run.status, run.count("deleted"), run.count("dead_lettered")) == ("complete", 100, 0)
    assert memory.contents("forged") == {}


def test_a_poison_message_naming_a_real_batch_moves_no_counter(rt):
    # Given a run with two batches in flight
    run_id, (first, _second) = _started(rt)
    rt.dispatcher = RecordingDispatcher()

    # When a message with the real token and batch id but 1,001 keys arrives
    process(rt, dict(first.to_message(), rest=[""] * 1001), "poison")

    # Then the batch is still in flight and nothing was counted
    run = rt.store.runs.get(run_id)
    assert (run.count("inflight"), run.count("dead_lettered"), run.count("batches_done")) == (
        2,
        0,
        0,
    )
    assert rt.store.runs.is_in_flight(run_id, first.batch_id)


def test_a_second_terminal_attempt_of_one_batch_does_not_end_the_run_early(rt):
    # Given a run with two batches, the first of which is recorded terminal twice (a
    # redelivered attempt that overlapped its own retry)
    run_id, (first, second) = _started(rt)
    store = rt.store
    for payload in (first, dataclasses.replace(first, attempt=1)):
        store.runs.record(
            run_id, "snapshots", BatchRecord(payload.batch_id, payload.claim, deleted=50)
        )

    # Then the run still waits for the second batch
    run = store.runs.get(run_id)
    assert (run.status, run.count("inflight")) == ("running", 1)
    assert store.runs.is_in_flight(run_id, second.batch_id)


def test_a_copy_with_a_redrive_generation_deletes_nothing_in_a_failed_run(rt):
    # Given a run that failed with its batches still in flight
    run_id, (first, _second) = _started(rt)
    rt.store.runs.fail(run_id, "listing_failed", "the listing broke mid-sweep")
    rt.dispatcher = RecordingDispatcher()

    # When a copy of a batch claiming to be a redrive (generation 1) arrives
    report = process(rt, dataclasses.replace(first, generation=1).to_message(), "forged")

    # Then nothing of it is deleted: no operator redrove that batch
    assert report.reason == "run_ended"
    assert len(memory.contents("forged")) == 100


def test_two_entries_of_one_batch_are_both_redriven_and_deleted(rt, redis_url):
    # Given a batch whose attempts dead-lettered one key at the first attempt (denied)
    # and another at the last (retries exhausted): two entries of one batch
    run_id, (first, second) = _started(rt)
    dispatcher = _queued(rt, redis_url)
    memory.fail("forged", "snap/0000", Outcome.PERMANENT, "AccessDenied")
    memory.fail("forged", "snap/0001", Outcome.TRANSIENT, "SlowDown")
    process(rt, first.to_message(), "t1")
    while dispatcher.sent:
        process(rt, dispatcher.sent.pop(0).payload.to_message(), "t1")
    process(rt, second.to_message(), "t2")
    entries = rt.dead_letters.entries(run=run_id)
    assert len(entries) == 2

    # When both causes are fixed and both entries are redriven and delivered
    memory.fail("forged", "snap/0000", Outcome.DELETED, "", times=0)
    memory.fail("forged", "snap/0001", Outcome.DELETED, "", times=0)
    moved = redrive_entries(rt, entries, dry_run=False).movable
    assert len(moved) == 2
    for _ in moved:
        kwargs, task_id = _next_work(rt)
        process(rt, kwargs, task_id)

    # Then both keys are gone and the run is complete, not stuck with one in flight
    assert memory.contents("forged") == {}
    run = rt.store.runs.get(run_id)
    assert (run.status, run.count("inflight"), run.count("dead_lettered")) == ("complete", 0, 0)


def test_a_redrive_while_its_batch_still_retries_keeps_the_run_open_until_both_end(rt, redis_url):
    # Given a batch that dead-lettered one key and is still retrying another
    run_id, (first, second) = _started(rt)
    dispatcher = _queued(rt, redis_url)
    memory.fail("forged", "snap/0000", Outcome.PERMANENT, "AccessDenied")
    memory.fail("forged", "snap/0001", Outcome.TRANSIENT, "SlowDown", times=1)
    process(rt, first.to_message(), "t1")
    retry = dispatcher.sent.pop(0).payload
    process(rt, second.to_message(), "t2")

    # When an operator redrives the dead letter, and the redrive ends before the retry
    memory.fail("forged", "snap/0000", Outcome.DELETED, "", times=0)
    assert redrive_entries(rt, rt.dead_letters.entries(run=run_id), dry_run=False).movable
    kwargs, task_id = _next_work(rt)
    process(rt, kwargs, task_id)
    assert rt.store.runs.get(run_id).status == "running"  # the retry is still in flight
    process(rt, retry.to_message(), "t1")

    # Then the run ends complete with every key gone and nothing left in flight
    run = rt.store.runs.get(run_id)
    assert (run.status, run.count("inflight")) == ("complete", 0)
    assert memory.contents("forged") == {}


def test_abort_of_a_failed_run_stops_the_redrives_already_sent(rt, redis_url):
    # Given a failed run whose dead letter an operator redrove
    run_id, (first, _second) = _started(rt)
    _queued(rt, redis_url)
    memory.fail("forged", "snap/0000", Outcome.PERMANENT, "AccessDenied")
    process(rt, first.to_message(), "t1")
    rt.store.runs.fail(run_id, "listing_failed", "the listing broke mid-sweep")
    memory.fail("forged", "snap/0000", Outcome.DELETED, "", times=0)
    assert redrive_entries(rt, rt.dead_letters.entries(run=run_id), dry_run=False).movable

    # When the run is aborted before the redrive is delivered
    assert rt.store.runs.abort(run_id, "stop") == "aborted"
    kwargs, task_id = _next_work(rt)
    report = process(rt, kwargs, task_id)

    # Then the redrive deletes nothing
    assert report.reason == "run_ended"
    assert "snap/0000" in memory.contents("forged")
