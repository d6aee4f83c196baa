"""Redis restarted empty mid-run: the workers reconnect and the next trigger converges."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.pipeline.messaging import BATCH_QUEUE
from tests.conftest import s3_targets
from tests.reliability.conftest import (
    Outcome,
    seed_scenario,
    start_run,
    store_for,
    wait_count,
)
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.slow


def _items(raw: bytes) -> list[str]:
    """The keys of a batch message as it sits in the Redis queue."""
    body = json.loads(base64.b64decode(json.loads(raw)["body"]))
    keys = BatchPayload.from_message(body[1]).keys
    assert keys
    return keys


def _dead_letters(stack: Stack) -> list[dict[str, Any]]:
    result = stack.cli("dlq", "list", "--json")
    assert result.code == 0, result
    return list(result.json()["entries"])


#: Celery logs this line each time the consumer (re)connects to the broker.
CONNECTED = "Connected to redis://"


@pytest.mark.timeout(900)
def test_redis_restarted_empty_mid_run(
    make_stack, weed, s3, proxy, redis_server, redis_url, figures
):
    """Redis restarted empty mid-run: the same cutoff run again finds the leftovers."""
    # Given a run of 10,000 expired keys under way on one worker, with S3 throttling a
    # third of the deletes, so retries wait in the worker's memory as Celery ETA tasks
    seeded = seed_scenario(weed, 10_000)
    proxy.delay = 0.2
    proxy.slowdown_rate = 0.3
    proxy.retry_after = 4
    stack = make_stack(
        s3_targets(seeded.bucket, batch_size=100),
        env={
            "CLEANUP_VISIBILITY_TIMEOUT": "15",
            "CLEANUP_MAX_RETRIES": "12",
            "CLEANUP_RETRY_CAP": "7",
        },
    )
    worker = stack.worker()
    store = store_for(redis_url)
    started = time.monotonic()
    run_id = start_run(stack, seeded)
    wait_count(store, run_id, "sweep_done", 1, timeout=300)
    wait_count(store, run_id, "batches_done", 15, timeout=300)
    # the oldest batch still queued, to play a message that outlived the crash
    survivor = store.redis.lindex(BATCH_QUEUE, -1)
    assert survivor is not None

    # When Redis crashes and comes back empty: runs, queues and checkpoints all gone
    redis_server.restart_empty()

    # Then the worker reconnects by itself
    wait_for(lambda: worker.output().count(CONNECTED) >= 2, 120, "the worker to reconnect")
    assert worker.alive()
    # and a batch of the lost run that surfaces now is dead-lettered, not deleted.  (A
    # batch that had passed its checks when Redis died may still send its delete: its
    # keys are the lost run's own, expired and in scope; the new run re-lists the rest.)
    survivor_keys = _items(survivor)
    sent_before = proxy.deleted_key_counts
    store.redis.lpush(BATCH_QUEUE, survivor)
    entries = wait_for(lambda: _dead_letters(stack), 60, "the survivor to be dead-lettered")
    assert [e["reason"] for e in entries] == ["unknown_run"]
    sent_after = proxy.deleted_key_counts
    assert [sent_after[k] - sent_before[k] for k in survivor_keys] == [0] * len(survivor_keys)

    # When the same cutoff is run again at once, as the next trigger would, while
    # retries of the lost run are still due in the worker
    again = stack.cli("run", "statements", "--cutoff", seeded.cutoff.isoformat(), "--wait",
                      "--json", "--timeout", "600")  # fmt: skip
    figures.converge_seconds = time.monotonic() - started
    leftovers = again.json()["expired"]

    # Then it lists the leftovers from S3 and deletes them: the pipeline converges
    run = again.json()
    assert again.code == 0, again
    assert run["status"] == "complete"
    assert run["action"] == "created"
    assert 0 < leftovers < len(seeded.expired)
    assert run["deleted"] == run["expired"]
    verify = stack.cli("verify", "statements", "--cutoff", seeded.cutoff.isoformat(), "--json")
    assert verify.code == 0, verify
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = len(seeded.expired) - len(outcome.expired_left)
    figures.duplicate_deliveries = run["duplicates"]
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    entries = _dead_letters(stack)
    figures.dead_lettered = sum(e["key_count"] for e in entries)
    figures.notes = (
        f"Redis killed and restarted empty after 15 batches of 100, with 30 % of deletes "
        f"throttled (Retry-After: 4) so that retries were due in the worker; it reconnected; "
        f"{leftovers} expired keys were left, which `digest-cleanup run` with the same cutoff "
        f"found and deleted. Celery drops what the worker held (running batches are "
        f"terminated, prefetched and ETA retries discarded on reconnect); a queued batch of "
        f"the lost run replayed into the new Redis was dead-lettered as unknown_run "
        f"({len(entries)} entry, its keys deleted by the new run instead)"
    )
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()
    # and what the lost run still had in flight was refused, never counted in the new run
    assert [e["reason"] for e in entries] == ["unknown_run"]
    assert run["dead_lettered"] == 0
    assert worker.alive()
