"""End to end: real `celery worker` processes, a real Redis and a real S3 server."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis

from digest_cleanup.model.batches import BatchPayload
from tests.conftest import list_keys, s3_targets, seed_split
from tests.rig.stack import wait_for

pytestmark = pytest.mark.e2e

EXPIRED = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(2000)]
FRESH = [f"statements/2026-11-22/cust-{i:06d}.pdf" for i in range(300)]
OUTSIDE = [f"receipts/2026-10-18/cust-{i:06d}.json" for i in range(200)]


def test_weekly_run_deletes_expired_and_keeps_everything_else(make_stack, s3, bucket, proxy):
    # Given 2,000 expired statements, 300 fresh ones and 200 old keys outside the prefix
    from tests.conftest import put_keys

    put_keys(s3, bucket, OUTSIDE)
    cutoff = seed_split(s3, bucket, EXPIRED, FRESH)
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=2)

    # When the run is started and waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then it completes having deleted exactly the expired statements
    assert result.code == 0, result
    run = result.json()
    assert run["status"] == "complete"
    assert run["deleted"] == 2000
    assert run["expired"] == 2000
    assert run["listed"] == 2300
    assert run["batches"] == 4
    assert run["dead_lettered"] == 0
    assert list_keys(s3, bucket) == set(FRESH) | set(OUTSIDE)
    # and no key outside the prefix was ever sent to DeleteObjects
    assert not any(k.startswith("receipts/") for k in proxy.deleted_key_counts)

    # And verify agrees nothing expired is left
    verify = stack.cli("verify", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert verify.code == 0, verify
    assert verify.json()["remaining_expired"] == 0

    # And running the same cutoff again deletes nothing more and still exits 0
    requests_before = proxy.delete_requests
    again = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    assert again.code == 0, again
    assert again.json()["run_id"] == run["run_id"]
    assert again.json()["action"] == "attached"
    assert proxy.delete_requests == requests_before
    assert list_keys(s3, bucket) == set(FRESH) | set(OUTSIDE)


def test_access_denied_keys_are_dead_lettered_and_the_rest_deleted(make_stack, s3, bucket, proxy):
    # Given 600 expired keys, 7 of which S3 refuses to delete
    keys = EXPIRED[:600]
    denied = {keys[3], keys[77], keys[150], keys[299], keys[420], keys[501], keys[599]}
    cutoff = seed_split(s3, bucket, keys, [])
    proxy.deny_keys = denied
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=2)

    # When the run is waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then it ends with failures, exactly the denied keys dead-lettered, the rest gone
    assert result.code == 1, result
    run = result.json()
    assert run["status"] == "complete_with_failures"
    assert run["dead_lettered"] == 7
    assert run["deleted"] == 593
    assert run["retries"] == 0  # AccessDenied is permanent: never retried
    assert list_keys(s3, bucket) == denied

    listing = stack.cli("dlq", "list", "--json").json()
    dead = {k["key"]: k["code"] for e in listing["entries"] for k in e["keys"]}
    assert dead == dict.fromkeys(denied, "AccessDenied")


def test_slowdown_is_retried_with_backoff_until_deleted(make_stack, s3, bucket, proxy):
    # Given S3 answers 60% of DeleteObjects with 503 SlowDown and Retry-After
    keys = EXPIRED[:1500]
    cutoff = seed_split(s3, bucket, keys, [])
    proxy.slowdown_rate = 0.6
    proxy.retry_after = 0
    stack = make_stack(s3_targets(bucket), env={"CLEANUP_MAX_RETRIES": "30"})
    stack.worker(concurrency=2)

    # When the run is waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then every key is deleted after retries, with nothing dead-lettered
    assert result.code == 0, result
    run = result.json()
    assert run["status"] == "complete"
    assert run["deleted"] == 1500
    assert run["dead_lettered"] == 0
    assert run["retries"] > 0
    assert run["duplicates"] == 0  # a retry acknowledges its message: nothing is redelivered
    assert proxy.faults_injected["slowdown"] > 0
    status = stack.cli("status", run["run_id"], "--json").json()
    assert status["failures_by_code"]["SlowDown"] >= run["retries"]
    assert list_keys(s3, bucket) == set()


def test_duplicate_batch_delivery_is_counted_once(make_stack, s3, bucket, redis_url):
    # Given a completed run
    keys = EXPIRED[:700]
    cutoff = seed_split(s3, bucket, keys, [])
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=1)
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["deleted"] == 700

    # When its first batch is delivered again (same batch id, attempt, keys and ETags)
    etag = f'"{hashlib.md5(b"%PDF-1.7 digest").hexdigest()}"'  # noqa: S324 - S3's ETag
    payload = BatchPayload(
        run_id=run["run_id"],
        target="statements",
        batch_id=f"{run['run_id']}-b00001",
        seq=1,
        cutoff=run["cutoff"],
        keys=keys[:500],
        conditions=[etag] * 500,
        run_token=run["token"],
        scope=run["scope"],
    )
    _send(stack, payload)
    client = redis.Redis.from_url(redis_url)
    deliveries = f"dc:run:{run['run_id']}:deliveries"
    wait_for(
        lambda: client.hget(deliveries, payload.claim) == b"2", 30, "the duplicate to be delivered"
    )
    wait_for(lambda: "duplicate" in stack.processes[0].output(), 30, "the duplicate to be recorded")

    # Then the run's counters are unchanged, and the duplicate is counted as such
    after = stack.cli("status", run["run_id"], "--json").json()
    for counter in ("deleted", "expired", "batches", "batches_done", "dead_lettered"):
        assert after[counter] == run[counter], counter
    assert after["duplicates"] == 1
    assert after["status"] == "complete"
    assert stack.cli("dlq", "list", "--json").json()["entries"] == []  # no junk dead letter


def _send(stack: Any, payload: BatchPayload) -> None:
    from digest_cleanup.app import create_app
    from digest_cleanup.settings import Settings

    app = create_app(Settings.from_env(stack.env))
    app.send_task("digest_cleanup.delete_batch", kwargs=payload.to_message(), queue="batches")


def test_a_listing_that_cannot_work_fails_the_run_and_says_why(make_stack):
    # Given a target whose bucket does not exist (sending no conditions, so no conditions
    # probe refuses the run before its listing: see test_conditions_gate)
    stack = make_stack(s3_targets("no-such-bucket-anywhere", conditional_deletes=False))
    stack.worker(concurrency=1)

    # When it runs
    result = stack.cli("run", "statements", "--wait", "--json", "--timeout", "60")

    # Then the run fails at once with the listing error, instead of hanging
    assert result.code == 3, result
    run = result.json()
    assert run["status"] == "failed"
    assert run["reason"] == "listing_failed"
    assert "NoSuchBucket" in run["message"]


def test_a_listing_interrupted_by_an_outage_is_retried(make_stack, s3, bucket, proxy):
    # Given S3 is unreachable when the sweep starts
    cutoff = seed_split(s3, bucket, EXPIRED[:600], [])
    stack = make_stack(s3_targets(bucket), env={"CLEANUP_MAX_RETRIES": "20"})
    worker = stack.worker(concurrency=1)
    proxy.down = True  # the run's conditions probe is spared; the sweep's listing is not

    # When the run starts, its sweep fails to list, and S3 comes back
    started = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert started.code == 0, started
    wait_for(lambda: "retry_in=" in worker.output(), 60, "the sweep to retry its slice")
    proxy.down = False
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then the sweep retried its slice and the run completed; the error count started
    # over once a slice made progress, so errors cannot add up across a long sweep
    assert result.code == 0, result
    assert result.json()["deleted"] == 600
    assert "retry_in=" in stack.processes[0].output()
    assert stack.cli("status", result.json()["run_id"], "--json").json()["sweep_errors"] == 0


def test_a_batch_from_an_earlier_incarnation_of_the_run_is_refused(make_stack, s3, bucket):
    # Given a completed run, and a batch of it published before the run was re-created
    # (as happens when Redis restarts empty and the same cutoff is triggered again)
    keys = EXPIRED[:100]
    cutoff = seed_split(s3, bucket, keys, [])
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=1)
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    stale = BatchPayload(
        run_id=run["run_id"],
        target="statements",
        batch_id=f"{run['run_id']}-b00001",
        seq=1,
        cutoff=run["cutoff"],
        keys=keys[:10],
        run_token="an-earlier-incarnation",
        scope=run["scope"],
    )

    # When that batch is delivered
    _send(stack, stale)

    # Then it is dead-lettered as stale, and the run's counters do not move
    entries = wait_for(
        lambda: stack.cli("dlq", "list", "--json").json()["entries"], 30, "the stale batch"
    )
    assert [e["reason"] for e in entries] == ["stale_run"]
    after = stack.cli("status", run["run_id"], "--json").json()
    assert (after["deleted"], after["dead_lettered"]) == (run["deleted"], run["dead_lettered"])
