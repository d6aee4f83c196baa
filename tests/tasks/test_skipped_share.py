"""A run that skips more than its target's ``max_skipped_share`` does not end ``complete``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.kinds import CHANGED_SINCE_LISTING, Outcome
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.model.run_view import RunView
from digest_cleanup.pipeline.batch import process
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import sweep_slice
from digest_cleanup.settings import Settings
from digest_cleanup.store.scripts import Script, build
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing import memory
from digest_cleanup.testing.dispatcher import recording

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
STORE = "skipped-share"
TARGETS = f"""
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "{STORE}"
prefix = "snap/"
retention_days = 0
schedule = "0 3 * * 0"
batch_size = 50
"""
KEYS = [f"snap/{i:04d}" for i in range(100)]


def _runtime(redis_url: str, extra: str = "") -> Runtime:
    memory.reset(STORE)
    memory.seed(STORE, dict.fromkeys(KEYS, CUTOFF - timedelta(days=1)))
    return Runtime(Settings(broker_url=redis_url), parse_targets(TARGETS + extra))


@pytest.fixture
def runtime(redis_url: str) -> Iterator[Runtime]:
    runtime = _runtime(redis_url)
    yield runtime
    runtime.close()
    memory.reset(STORE)


def _run_with_skips(runtime: Runtime, skipped: int) -> RunView:
    """A run of 100 expired keys in which ``skipped`` were rewritten since the listing."""
    for key in KEYS[:skipped]:
        memory.fail(STORE, key, Outcome.SKIPPED, CHANGED_SINCE_LISTING)
    published: list[BatchPayload] = []
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    assert sweep_slice(recording(runtime, published.append), run_id) == "done"
    for n, payload in enumerate(published):
        process(recording(runtime), payload.to_message(), f"t{n}")
    return runtime.store.runs.get(run_id)


def test_skipping_more_than_a_tenth_by_default_ends_complete_with_failures(runtime):
    # Given a target without max_skipped_share, and 11 of a run's 100 keys rewritten

    # When the run ends
    run = _run_with_skips(runtime, 11)

    # Then it is complete_with_failures, though nothing was dead-lettered, and says why
    assert (run.count("deleted"), run.count("skipped"), run.count("dead_lettered")) == (89, 11, 0)
    assert run.status == "complete_with_failures"
    assert run["reason"] == "max_skipped_share_exceeded"
    assert "11 of 100" in run["message"]
    assert "max_skipped_share" in run["message"]
    assert run.as_dict()["max_skipped_share"] == 0.1


def test_skipping_a_tenth_or_less_still_ends_complete(runtime):
    run = _run_with_skips(runtime, 10)

    assert run.count("skipped") == 10
    assert run.status == "complete"
    assert "reason" not in run.fields


def test_the_targets_own_share_decides(redis_url):
    # Given a target that allows half its keys to be skipped
    runtime = _runtime(redis_url, "max_skipped_share = 0.5\n")
    try:
        # When 40 of 100 are skipped, the run is complete
        assert _run_with_skips(runtime, 40).status == "complete"
    finally:
        runtime.close()
        memory.reset(STORE)


def test_a_run_opened_before_the_share_existed_is_held_to_the_default(redis_client):
    # Given a finished-looking run hash without a max_skipped_share field
    run = "dc:run:test-finish-legacy"
    redis_client.delete(run)
    redis_client.hset(
        run,
        mapping={"status": "running", "sweep_done": 1, "inflight": 0, "expired": 100,
                 "deleted": 80, "dead_lettered": 0, "skipped": 20},
    )  # fmt: skip

    # When the finish script runs
    finish = build("finish_only.lua", "-- KEYS: run\n-- ARGV: now\n-- include: finish.lua\n"
                                      "return finish(run, now)")  # fmt: skip
    script = Script(redis_client, finish)
    assert script(keys={"run": run}, args={"now": "2026-11-22T03:00:00+00:00"}) == 1

    # Then the default share applies
    assert redis_client.hget(run, "status") == b"complete_with_failures"
    redis_client.delete(run)
