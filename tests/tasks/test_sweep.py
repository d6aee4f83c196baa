"""The sweep as plain functions on a real Redis: slicing, checkpoints, crash and resume."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.batches import BatchPayload
from digest_cleanup.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.sweep import start, sweep_slice
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing import memory

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
TARGETS = """
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "sweep"
prefix = "snap/"
page_size = 100
retention_days = 30
schedule = "0 3 * * 0"
batch_size = 50
"""


class Crash(Exception):
    """Stands in for a worker dying in the middle of a sweep slice."""


@pytest.fixture
def runtime(redis_url: str) -> Iterator[Runtime]:
    memory.reset("sweep")
    memory.seed("sweep", {f"snap/{i:05d}": CUTOFF - timedelta(days=1) for i in range(1000)})
    memory.seed("sweep", {f"snap/z{i:04d}": CUTOFF + timedelta(days=1) for i in range(30)})
    runtime = Runtime(Settings(broker_url=redis_url), parse_targets(TARGETS))
    yield runtime
    runtime.close()
    memory.reset("sweep")


def test_a_crashed_sweep_resumes_from_its_checkpoint_and_loses_no_batch(runtime):
    # Given a run whose sweep dies right after publishing its seventh batch
    run_id = start(runtime, runtime.target("snapshots"), CUTOFF, lambda _: None).run_id
    published: list[str] = []

    def crashing(payload: BatchPayload) -> None:
        published.append(payload.batch_id)
        if len(published) == 7:
            raise Crash

    with pytest.raises(Crash):
        sweep_slice(runtime, run_id, crashing)

    # When the redelivered slice runs again
    resumed: list[BatchPayload] = []
    assert sweep_slice(runtime, run_id, resumed.append) == "done"

    # Then every batch was published, only the crashed page's outbox twice
    all_ids = published + [p.batch_id for p in resumed]
    assert set(all_ids) == {f"{run_id}-b{n:05d}" for n in range(1, 21)}
    twice = sorted(b for b, n in Counter(all_ids).items() if n > 1)
    assert twice == [f"{run_id}-b00007"]  # its page's outbox was b00007 and b00008
    # and the republished batch has exactly the same items as the first time would have
    items = {p.batch_id: p.items for p in resumed}
    assert items[f"{run_id}-b00007"] == [f"snap/{i:05d}" for i in range(300, 350)]
    # and the run counts each batch in flight once
    run = runtime.store.get(run_id)
    assert (run.count("batches"), run.count("inflight")) == (20, 20)
    assert (run.count("listed"), run.count("expired")) == (1030, 1000)


def test_a_slice_hands_over_when_its_time_is_up(runtime):
    run_id = start(runtime, runtime.target("snapshots"), CUTOFF, lambda _: None).run_id
    sent: list[BatchPayload] = []
    results = []
    while not results or results[-1] == "continue":
        results.append(sweep_slice(runtime, run_id, sent.append, slice_seconds=1e-9))

    assert results[-1] == "done"
    assert len(results) > 5  # one page per slice at this budget
    assert sorted(p.seq for p in sent) == list(range(1, 21))


def test_a_second_copy_of_a_slice_attaches_while_the_first_holds_the_lease(runtime):
    run_id = start(runtime, runtime.target("snapshots"), CUTOFF, lambda _: None).run_id
    results: list[str] = []

    def publish(_: BatchPayload) -> None:
        if not results:  # while the first slice is mid-page, a duplicate arrives
            results.append(sweep_slice(runtime, run_id, publish))

    sweep_slice(runtime, run_id, publish)
    assert results == ["attached"]
