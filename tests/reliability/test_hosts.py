"""Workers on hosts of their own: one host cut off mid-batch for longer than the visibility
timeout, then healed, while another host finishes its batches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from digest_cleanup.store.runs import RunStore
from tests.conftest import s3_targets
from tests.reliability.conftest import (
    Outcome,
    seed_scenario,
    start_run,
    store_for,
    wait_count,
    wait_finished,
)
from tests.reliability.hosts import Host, Relay, worker_hosts
from tests.rig.stack import Process

pytestmark = pytest.mark.slow

#: Short, so the cut-off host's batches come back within seconds, yet longer than a
#: batch takes here (100 keys, requests slowed to 0.3 s by the proxy).
VISIBILITY_SECONDS = 6


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    """Two worker hosts, deleted again whatever the test does."""
    with worker_hosts(1, 2) as made:
        yield made


@pytest.mark.timeout(900)
def test_a_host_cut_off_mid_batch_is_fenced_and_its_batches_finish_elsewhere(
    make_stack, weed, s3, proxy, redis_url, hosts, figures
):
    """Host cut off: a worker host's link down mid-batch for 3x the visibility timeout."""
    # Given 6,000 expired keys, a sweep worker here, and a batch worker on each of two
    # hosts that reach Redis and S3 only over their own link
    seeded = seed_scenario(weed, 6_000)
    proxy.delay = 0.3  # each request a little slow, so the cut lands mid-batch
    env = {"CLEANUP_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS)}
    stack = make_stack(s3_targets(seeded.bucket, batch_size=100), env=env)
    redis_port = int(urlsplit(redis_url).port or 6379)
    relays: list[Relay] = []
    workers = []
    for host in hosts:
        to_redis, to_s3 = Relay(host.root_address, redis_port), Relay(host.root_address, proxy.port)
        relays += [to_redis, to_s3]
        host_env = {
            "CLEANUP_BROKER_URL": f"redis://{to_redis.url_netloc}/0",
            "CLEANUP_S3_ENDPOINT_URL": f"http://{to_s3.url_netloc}",
        }
        workers.append(
            stack.worker(queues="batches", concurrency=2, env=host_env, prefix=host.run_prefix())
        )
    stack.worker(queues="sweeps", concurrency=1)
    store = store_for(redis_url)
    cut, survivor = hosts[0], workers[1]
    try:
        started = time.monotonic()
        run_id = start_run(stack, seeded)

        # When the first host's link goes down while it is deleting a batch, stays down
        # for three visibility timeouts, and comes back
        _wait_busy(store, run_id, workers[0])
        cut.cut()
        time.sleep(3 * VISIBILITY_SECONDS)  # the outage itself: a duration, not a condition
        cut.heal()
        run = wait_finished(store, run_id, 600, "the run to finish after the heal")
        figures.converge_seconds = time.monotonic() - started
        # The other host may have finished the run before the heal; the cut host's late
        # attempt reaches the run store only once its link is back, so wait for it.
        wait_count(store, run_id, "duplicates", 1, 120)
        run = store.runs.get(run_id)
    finally:
        for relay in relays:
            relay.stop()

    # Then the other host finished the cut host's batches, the cut host's late writes
    # counted nothing twice, every expired key is gone and nothing else was touched
    outcome = Outcome.check(s3, seeded, proxy)
    figures.record(outcome, seeded)
    figures.deleted = len(seeded.expired) - len(outcome.expired_left)
    figures.duplicate_deliveries = run.count("duplicates")
    figures.keys_sent_twice = len(proxy.duplicate_deletes())
    figures.dead_lettered = run.count("dead_lettered")
    figures.notes = (
        "a sweep worker in the root namespace and a batch worker (2 processes) on each of "
        "two network-namespace hosts, which reach Redis and S3 over their own veth link; "
        f"with a {VISIBILITY_SECONDS} s visibility timeout, the first host's link is taken "
        f"down while it deletes a batch, for {3 * VISIBILITY_SECONDS} s, then brought back. "
        "Its unacknowledged batches are delivered to the other host; whatever it sends "
        "after the heal is a duplicate attempt, counted once"
    )
    assert run.status == "complete", run.fields
    assert outcome.expired_left == set()
    assert outcome.wrongly_deleted == set()
    assert outcome.sent_out_of_scope == set()
    assert run.count("expired") == len(seeded.expired)
    assert run.count("deleted") == len(seeded.expired)
    assert run.count("dead_lettered") == 0
    assert run.count("inflight") == 0
    assert run.count("duplicates") >= 1, "the cut host's batches were delivered again"
    assert "delete_batch" in survivor.output()


def _wait_busy(store: RunStore, run_id: str, worker: Process) -> None:
    """Wait until ``worker`` has started a batch of the run and some keys are deleted."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "Task digest_cleanup.delete_batch" in worker.output() and (
            store.runs.get(run_id).count("deleted") > 0
        ):
            return
        time.sleep(0.1)
    raise TimeoutError("the first host never started a batch")
