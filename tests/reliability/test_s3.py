"""S3 faults behind the proxy: throttling, outages short and long, denied keys, slowness."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import s3_targets
from tests.reliability.conftest import (
    Outcome,
    seed_scenario,
    start_run,
    store_for,
    wait_count,
    wait_finished,
)
from tests.rig.stack import Stack

pytestmark = pytest.mark.slow


def _dead_letters(stack: Stack) -> list[dict[str, Any]]:
    result = stack.cli("dlq", "list", "--json")
    assert result.code == 0, result
    return list(result.json()["entries"])


def _redrive_all(stack: Stack) -> None:
    result = stack.cli("dlq", "redrive", "--all", "--json")
    assert result.code == 0, result


@pytest.mark.timeout(900)
def test_slowdown_on_30_percent_of_deletes(make_stack, weed, s3, proxy, redis_url, figures):
    """S3 throttling: 30 % of DeleteObjects answered 503 SlowDown with Retry-After: 1."""
    # Given S3 throttles 30 % of delete requests
    seeded = seed_scenario(weed, 5_000)
    proxy.slowdown_rate = 0.3
    proxy.retry_after = 1
    stack = make_stack(
        s3_targets(seeded.bucket, batch_size=100),
        env={
            "CLEANUP_VISIBILITY_TIMEOUT": "20",
            "CLEANUP_MAX_RETRIES": "10",
            "CLEANUP_RETRY_BASE": "0.5",
            "CLEANUP_RETRY_CAP": "5",
        },
    )
    stack.worker()
    started = time.monotonic()

    # When the run is waited for
    result = stack.cli("run", "statements", "--cutoff", seeded.cutoff.isoformat(), "--wait",
                       "--json", "--timeout", "600")  # fmt: skip
    run = result.json()
    figures.converge_seconds = time.monotonic() - started

    # Then every expired key is deleted after retries, none dead-lettered
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = run["deleted"]
    figures.duplicate_deliveries = run["duplicates"]
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.notes = (
        f"{proxy.faults_injected['slowdown']} SlowDown answers, {run['retries']} retries "
        "honouring Retry-After (up to 10 per batch, capped at 5 s); batches of 100"
    )
    assert result.code == 0, result
    assert run["status"] == "complete"
    assert run["dead_lettered"] == 0
    assert run["deleted"] == len(seeded.expired)
    assert run["retries"] > 0
    assert proxy.faults_injected["slowdown"] > 0
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()
    assert _dead_letters(stack) == []


@pytest.mark.timeout(900)
def test_s3_unreachable_for_30_seconds(make_stack, weed, s3, proxy, redis_url, figures):
    """S3 unreachable for 30 s mid-run: listing and deletes retried past it, then complete."""
    # Given a retry budget well past 30 s: 16 retries, backoff doubling from 1 s up to 10 s
    seeded = seed_scenario(weed, 10_000)
    proxy.delay = 0.05
    stack = make_stack(
        s3_targets(seeded.bucket, batch_size=250),
        env={
            "CLEANUP_VISIBILITY_TIMEOUT": "20",
            "CLEANUP_MAX_RETRIES": "16",
            "CLEANUP_RETRY_BASE": "1",
            "CLEANUP_RETRY_CAP": "10",
        },
    )
    stack.worker()
    store = store_for(redis_url)
    started = time.monotonic()
    run_id = start_run(stack, seeded)

    # When S3 drops every connection for 30 s, starting while the run is under way
    wait_count(store, run_id, "batches_done", 2, timeout=300)
    proxy.down_for(30)
    run = wait_finished(store, run_id, 600)
    figures.converge_seconds = time.monotonic() - started

    # Then the run completes with every key deleted and nothing dead-lettered
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = run.count("deleted")
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    codes = store.runs.retry_codes(run_id)
    figures.notes = (
        f"every connection dropped for 30 s once 2 batches of 250 were done; "
        f"{run.count('retries')} retries by code {codes}; "
        "the retry budget (16 retries, 1 s doubling to 10 s, full jitter) outlasts the outage"
    )
    assert run.status == "complete", run.fields
    assert run.count("deleted") == len(seeded.expired)
    assert run.count("dead_lettered") == 0
    assert proxy.faults_injected["down"] > 0
    assert set(codes) & {"connection_error", "timeout"}
    # and no retried slice or duplicate delivery left a dead letter behind
    assert _dead_letters(stack) == []
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()


@pytest.mark.timeout(900)
def test_s3_down_longer_than_the_retry_budget(make_stack, weed, s3, proxy, redis_url, figures):
    """S3 down past the retry budget: dead letters with a reason, then `dlq redrive --all`."""
    # Given a run whose batches are all published, and a small retry budget (about 2 s)
    seeded = seed_scenario(weed, 3_000)
    stack = make_stack(
        s3_targets(seeded.bucket),
        env={
            "CLEANUP_MAX_RETRIES": "2",
            "CLEANUP_RETRY_BASE": "0.2",
            "CLEANUP_RETRY_CAP": "1",
        },
    )
    stack.worker(queues="sweeps")
    store = store_for(redis_url)
    started = time.monotonic()
    run_id = start_run(stack, seeded)
    wait_count(store, run_id, "batches", 6, timeout=120)
    wait_count(store, run_id, "sweep_done", 1, timeout=120)

    # When S3 is unreachable for longer than every batch's retries take
    proxy.down = True
    stack.worker(queues="batches")
    run = wait_finished(store, run_id, 300)

    # Then every batch is dead-lettered as retries_exhausted with the connection error
    assert run.status == "complete_with_failures", run.fields
    assert run.count("dead_lettered") == len(seeded.expired)
    entries = _dead_letters(stack)
    assert {e["reason"] for e in entries} == {"retries_exhausted"}
    dead = {k["key"]: k["code"] for e in entries for k in e["keys"]}
    assert set(dead) == seeded.expired
    assert set(dead.values()) <= {"connection_error", "timeout"}
    figures.dead_lettered = len(dead)

    # And when S3 is back and ops redrive everything, the run completes
    proxy.down = False
    _redrive_all(stack)
    run = wait_finished(store, run_id, 300)
    figures.converge_seconds = time.monotonic() - started
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = run.count("deleted")
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.notes = (
        "every connection dropped once all 6 batches of 500 were published; 2 retries "
        "(about 2 s) then each batch is dead-lettered as retries_exhausted "
        f"({', '.join(sorted(set(dead.values())))}); S3 back, `dlq redrive --all` "
        "completes the same run"
    )
    assert run.status == "complete", run.fields
    assert run.count("deleted") == len(seeded.expired)
    assert run.count("redriven") == len(seeded.expired)
    assert run.count("dead_lettered") == 0
    assert _dead_letters(stack) == []
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()


@pytest.mark.timeout(900)
def test_access_denied_on_a_subset(make_stack, weed, s3, proxy, redis_url, figures):
    """Per-key AccessDenied on 37 keys: exactly those dead-lettered, then redriven."""
    # Given S3 refuses to delete 37 particular keys
    seeded = seed_scenario(weed, 5_000)
    denied = set(sorted(seeded.expired)[::135][:37])
    proxy.deny_keys = denied
    stack = make_stack(s3_targets(seeded.bucket))
    stack.worker()
    store = store_for(redis_url)
    started = time.monotonic()

    # When the run is waited for
    run_id = start_run(stack, seeded)
    run = wait_finished(store, run_id, 300)

    # Then exactly those keys are dead-lettered as AccessDenied, the rest deleted
    assert run.status == "complete_with_failures", run.fields
    assert run.count("dead_lettered") == len(denied)
    assert run.count("deleted") == len(seeded.expired) - len(denied)
    assert run.count("retries") == 0  # permanent: never retried
    dead = {k["key"]: k["code"] for e in _dead_letters(stack) for k in e["keys"]}
    assert dead == dict.fromkeys(denied, "AccessDenied")
    during = Outcome.check(s3, seeded, proxy)
    assert during.expired_left == denied
    figures.dead_lettered = len(dead)

    # And once the permission is fixed, a redrive deletes them into the same run
    proxy.deny_keys = set()
    _redrive_all(stack)
    run = wait_finished(store, run_id, 300)
    figures.converge_seconds = time.monotonic() - started
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = run.count("deleted")
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.notes = (
        "the proxy answers a per-key AccessDenied for 37 keys spread over the batches; "
        "exactly those 37 are dead-lettered, the other keys of their batches deleted; "
        "after the fix a redrive deletes them"
    )
    assert run.status == "complete", run.fields
    assert run.count("deleted") == len(seeded.expired)
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()


@pytest.mark.timeout(900)
def test_slow_s3_runs_nothing_twice(make_stack, weed, s3, proxy, redis_url, figures):
    """Slow S3: every request takes 2 s, and no task outlives the 15 s visibility timeout."""
    # Given an S3 that takes 2 s over every request, and a 15 s visibility timeout
    seeded = seed_scenario(weed, 3_000)
    proxy.delay = 2
    stack = make_stack(
        s3_targets(seeded.bucket, batch_size=250), env={"CLEANUP_VISIBILITY_TIMEOUT": "15"}
    )
    stack.worker()
    store = store_for(redis_url)
    started = time.monotonic()

    # When the run is waited for
    run_id = start_run(stack, seeded)
    run = wait_finished(store, run_id, 600)
    figures.converge_seconds = time.monotonic() - started

    # Then it completes, and no batch ran twice: no redelivery, no key sent twice
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = run.count("deleted")
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.notes = (
        "2 s before every S3 request (listing pages and deletes); the sweep hands over "
        "every 5 s (a third of the visibility timeout), batches of 250 take one request"
    )
    assert run.status == "complete", run.fields
    assert run.count("deleted") == len(seeded.expired)
    assert run.count("duplicates") == 0
    assert proxy.duplicate_deletes() == {}
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()
