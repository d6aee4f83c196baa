"""Worker faults: SIGKILL of whole process groups, and a warm shutdown mid-run."""

from __future__ import annotations

import time

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
from tests.rig.stack import Process

pytestmark = pytest.mark.slow

#: Short, so a killed worker's batches come back within seconds, yet longer than any
#: task here (batches of 100 keys, sweep slices of a third of it).
VISIBILITY = {"CLEANUP_VISIBILITY_TIMEOUT": "15"}


@pytest.mark.timeout(1200)
def test_worker_sigkill_five_times(make_stack, weed, s3, proxy, redis_url, figures):
    """Worker SIGKILL: the whole process group, 5 times during one 20,000-key run."""
    # Given 20,000 expired keys, and two workers of two processes each
    seeded = seed_scenario(weed, 20_000)
    proxy.delay = 0.2  # every request a little slow, so the kills land mid-run
    stack = make_stack(s3_targets(seeded.bucket, batch_size=100), env=VISIBILITY)
    workers: list[Process] = [stack.worker(), stack.worker()]
    store = store_for(redis_url)
    started = time.monotonic()

    # When the oldest worker is SIGKILLed with its pool 5 times, a replacement started each time
    run_id = start_run(stack, seeded)
    for share in (0.1, 0.25, 0.4, 0.55, 0.7):
        wait_count(store, run_id, "deleted", int(len(seeded.expired) * share), timeout=600)
        workers.pop(0).kill()
        workers.append(stack.worker())
    run = wait_finished(store, run_id, 900)
    figures.converge_seconds = time.monotonic() - started

    # Then the replacements finish the run: every expired key gone, nothing else touched
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = len(seeded.expired) - len(outcome.expired_left)
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.dead_lettered = run.count("dead_lettered")
    figures.notes = (
        "two workers of two processes; at 10, 25, 40, 55 and 70 % of the keys deleted the "
        "oldest worker's process group is SIGKILLed and a new worker started. Its unacked "
        "batches come back after the 15 s visibility timeout and are delivered again; "
        "requests take 0.2 s each through the proxy so that the kills land mid-run"
    )
    assert run.status == "complete", run.fields
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()
    # and the counters add up exactly, duplicates counted apart and never twice
    assert run.count("expired") == len(seeded.expired)
    assert run.count("deleted") == len(seeded.expired)
    assert run.count("dead_lettered") == 0
    # and the kills did hit work in flight: some batches were delivered again
    assert run.count("duplicates") > 0
    assert all(w.alive() for w in workers)


@pytest.mark.timeout(900)
def test_warm_shutdown_mid_run(make_stack, weed, s3, proxy, redis_url, figures):
    """Warm shutdown: SIGTERM to the only worker mid-run, then a new worker."""
    # Given a run of 10,000 expired keys on one worker
    seeded = seed_scenario(weed, 10_000)
    proxy.delay = 0.1
    stack = make_stack(s3_targets(seeded.bucket, batch_size=100), env=VISIBILITY)
    worker = stack.worker()
    store = store_for(redis_url)
    started = time.monotonic()
    run_id = start_run(stack, seeded)
    wait_count(store, run_id, "batches_done", 20, timeout=300)

    # When the worker gets SIGTERM, Celery's warm shutdown
    code = worker.terminate(timeout=120)

    # Then it finishes what it was running and exits cleanly, leaving the run unfinished
    assert code == 0, worker.output()[-2000:]
    assert "Warm shutdown" in worker.output()
    assert not store.runs.get(run_id).finished

    # And when a new worker starts, the run completes with nothing lost or repeated
    stack.worker()
    run = wait_finished(store, run_id, 600)
    figures.converge_seconds = time.monotonic() - started
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = len(seeded.expired) - len(outcome.expired_left)
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.notes = (
        "SIGTERM after 20 batches of 100; the worker finishes its running batches, its "
        "prefetched ones go back to the queue undelivered, and a worker started afterwards "
        "finishes the run"
    )
    assert run.status == "complete", run.fields
    assert run.count("deleted") == len(seeded.expired)
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()
    assert run.count("duplicates") == 0
    assert proxy.duplicate_deletes() == {}
