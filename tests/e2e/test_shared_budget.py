"""One delete budget for every worker: real workers, Redis, ``weed mini``, and a model of AWS S3.

Every delete goes through :class:`~tests.rig.aws_model.AwsModel`, whose
records say when each request arrived, from which worker process (the client's
User-Agent carries its pid) and how many keys it carried, so every rate here is
measured where S3 would see it, not reported by the workers themselves.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from digest_cleanup.demo.seed import create_bucket, digest_layout_keys, seed_keys
from digest_cleanup.model.run_view import RunView
from digest_cleanup.store.budget import BURST_SECONDS, DECREASE_FACTOR, DeleteBudget
from digest_cleanup.store.runs import RunStore
from tests.conftest import list_keys, s3_targets
from tests.reliability.hosts import Host, Relay, worker_hosts
from tests.rig.aws_model import AwsModel
from tests.rig.aws_records import Arrival
from tests.rig.servers import WeedServer
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.e2e

#: The budget every test gives its target, and the model's own write budget: a worker
#: fleet that keeps to the first is never throttled by the second.
BUDGET = 1500
#: Small batches, so rates measured over a second or two are not lumpy.
BATCH = 100
KEYS = 6_000
#: Threads of each batch worker: far more than the budget needs, so that only the
#: budget, not the pool, holds the rate down.
THREADS = 8
_PID = re.compile(r"pid/(\d+)")


@pytest.fixture
def model(weed: WeedServer) -> Iterator[AwsModel]:
    with AwsModel(weed.endpoint_url, write_rate=BUDGET, seed=7) as proxy:
        yield proxy


@pytest.fixture
def store(redis_url: str) -> RunStore:
    return RunStore(redis.Redis.from_url(redis_url, socket_timeout=10))


def seed(weed: WeedServer, count: int = KEYS) -> tuple[str, datetime]:
    """A fresh bucket of ``count`` expired statements, and a cutoff after them."""
    bucket = f"budget-{uuid.uuid4().hex[:10]}"
    create_bucket(weed.endpoint_url, bucket)
    seed_keys(weed.endpoint_url, bucket, digest_layout_keys("statements/", count, "2026-10-18"))
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    return bucket, cutoff


def budgeted_stack(
    make_stack: Callable[..., Stack], model: AwsModel, bucket: str, redis_url: str
) -> tuple[Stack, DeleteBudget]:
    stack = make_stack(
        s3_targets(bucket, batch_size=BATCH, delete_rate=BUDGET), direct_s3=model.endpoint_url
    )
    budget = DeleteBudget(redis.Redis.from_url(redis_url), "dc", "statements", BUDGET)
    budget.redis.delete(budget.key)  # the session's Redis may hold an earlier test's
    return stack, budget


def two_batch_workers(
    make_stack: Callable[..., Stack], model: AwsModel, bucket: str, redis_url: str
) -> tuple[Stack, DeleteBudget]:
    """A budgeted stack with a sweep worker and two batch workers of :data:`THREADS` each."""
    stack, budget = budgeted_stack(make_stack, model, bucket, redis_url)
    stack.worker(queues="sweeps", pool="threads", concurrency=1)
    for _ in range(2):
        stack.worker(queues="batches", pool="threads", concurrency=THREADS)
    return stack, budget


def start(stack: Stack, cutoff: datetime) -> str:
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert result.code == 0, result
    run_id: str = result.json()["run_id"]
    return run_id


def finished(store: RunStore, run_id: str, timeout: float = 240) -> RunView:
    def done() -> RunView | None:
        run = store.runs.find(run_id)
        return run if run is not None and run.finished else None

    run: RunView = wait_for(done, timeout, f"run {run_id} to finish", interval=0.2)
    return run


def accepted_by_worker(arrivals: list[Arrival]) -> dict[str, int]:
    """Keys each worker process got accepted, by the pid in its User-Agent."""
    counts: dict[str, int] = {}
    for arrival in arrivals:
        match = _PID.search(arrival.agent)
        if match and arrival.accepted:
            counts[match.group(1)] = counts.get(match.group(1), 0) + arrival.accepted
    return counts


def fleet_rate(arrivals: list[Arrival]) -> float:
    """Accepted keys per second from the first accepted request to the last."""
    accepted = [a for a in arrivals if a.accepted]
    span = accepted[-1].at - accepted[0].at
    return sum(a.accepted for a in accepted[:-1]) / span


def assert_all_deleted(run: RunView, s3: Any, bucket: str, keys: int = KEYS) -> None:
    assert run.status == "complete", run.fields
    assert (run.count("deleted"), run.count("dead_lettered")) == (keys, 0)
    assert list_keys(s3, bucket) == set()


def test_two_workers_together_never_exceed_the_budget(
    make_stack, weed, s3, model, redis_url, store
):
    # Given two batch workers of 8 threads each, and a target budget of 1,500 keys/s
    bucket, cutoff = seed(weed)
    stack, budget = two_batch_workers(make_stack, model, bucket, redis_url)

    # When a 6,000-key run goes through the model of S3
    run_id = start(stack, cutoff)
    run = finished(store, run_id)

    # Then both workers deleted, and together they never passed the budget at S3:
    # no second held more than a second of budget, plus the burst and one batch of slack
    assert_all_deleted(run, s3, bucket)
    arrivals = model.arrivals()
    shares = accepted_by_worker(arrivals)
    assert len(shares) == 2, shares
    assert min(shares.values()) > KEYS / 5, shares
    assert model.throttled_requests == 0
    assert model.max_window_keys(1.0) <= BUDGET * (1 + BURST_SECONDS) + 2 * BATCH
    # And they used it: the fleet ran at the budget, not below it
    assert fleet_rate(arrivals) >= 0.9 * BUDGET
    assert budget.state().reserved_keys == KEYS
    # And status shows the budget the run kept to
    status = stack.cli("status", run_id, "--json")
    shown = status.json()["delete_budget"]
    assert (shown["ceiling"], shown["rate"], shown["throttles"]) == (BUDGET, BUDGET, 0)
    assert "delete rate    1,500 of 1,500 keys/s; 0 throttled" in stack.cli("status", run_id).stdout


def test_a_slowdown_burst_lowers_the_rate_of_both_workers(
    make_stack, weed, s3, model, redis_url, store
):
    # Given two batch workers and a run long enough to watch it before and after
    bucket, cutoff = seed(weed, 9_000)
    stack, budget = two_batch_workers(make_stack, model, bucket, redis_url)
    run_id = start(stack, cutoff)

    # When S3 answers SlowDown (a 503) to three requests in a row, a third into the run
    wait_for(lambda: model.keys_accepted >= 3_000, 120, "a third of the keys deleted")
    model.force_throttle(3, form="503")
    wait_for(lambda: model.throttled_requests >= 3, 30, "the three throttles")
    first_throttle = min(a.at for a in model.arrivals() if a.form)
    throttled_at = max(a.at for a in model.arrivals() if a.form)
    run = finished(store, run_id)

    # Then the shared rate fell once, for the whole burst
    state = budget.state()
    assert (state.throttles, state.decreases) == (3, 1)
    # And at S3 the fleet's rate over the next two seconds fell with it, from the budget
    # to about 0.7 of it, while each of the two workers went on sending
    arrivals = model.arrivals()
    before = model.accepted_rate(first_throttle - 1.5, first_throttle)
    after = model.accepted_rate(throttled_at + 0.3, throttled_at + 2.3)
    assert before >= 0.85 * BUDGET
    assert after <= (DECREASE_FACTOR + 0.15) * BUDGET
    later = [a for a in arrivals if throttled_at + 0.3 <= a.at < throttled_at + 2.3]
    assert len(accepted_by_worker(later)) == 2
    # And the throttled keys were retried: nothing left, nothing dead-lettered
    assert_all_deleted(run, s3, bucket, 9_000)


def test_a_retry_after_pauses_both_workers(make_stack, weed, s3, model, redis_url, store):
    bucket, cutoff = seed(weed)
    stack, budget = two_batch_workers(make_stack, model, bucket, redis_url)
    run_id = start(stack, cutoff)

    # When S3 throttles one request with x-amz-retry-after: 1500 (milliseconds)
    wait_for(lambda: model.keys_accepted >= KEYS // 3, 120, "a third of the keys deleted")
    model.force_throttle(1, form="503", retry_after_ms=1500)
    wait_for(lambda: model.throttled_requests >= 1, 30, "the throttle")
    throttled_at = next(a.at for a in model.arrivals() if a.form)
    run = finished(store, run_id)

    # Then no worker sent a delete for the 1.5 s that followed, once the requests already
    # on their way had arrived; then both resumed
    arrivals = model.arrivals()
    paused = [a for a in arrivals if throttled_at + 0.25 <= a.at < throttled_at + 1.45]
    assert paused == []
    resumed = [a for a in arrivals if a.at >= throttled_at + 1.45]
    assert len(accepted_by_worker(resumed)) == 2
    assert budget.state().pauses == 1
    assert_all_deleted(run, s3, bucket)


# ---------------------------------------------------------------- three hosts


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    with worker_hosts(11, 12, 13) as made:
        yield made


@pytest.mark.timeout(600)
def test_workers_on_three_hosts_share_one_budget(
    make_stack, weed, s3, model, redis_url, store, hosts
):
    """One host, then three: the fleet's rate at S3 stays within 10% of the budget."""
    redis_port = int(urlsplit(redis_url).port or 6379)
    relays: list[Relay] = []
    rates: dict[int, float] = {}
    try:
        for count in (1, 3):
            # Given batch workers on `count` network-namespace hosts, each reaching Redis
            # and S3 over its own link, and one sweep worker here
            bucket, cutoff = seed(weed)
            stack, _budget = budgeted_stack(make_stack, model, bucket, redis_url)
            stack.worker(queues="sweeps", pool="threads", concurrency=1)
            for host in hosts[:count]:
                to_redis = Relay(host.root_address, redis_port)
                to_s3 = Relay(host.root_address, model.port)
                relays += [to_redis, to_s3]
                env = {
                    "CLEANUP_BROKER_URL": f"redis://{to_redis.url_netloc}/0",
                    "CLEANUP_S3_ENDPOINT_URL": f"http://{to_s3.url_netloc}",
                }
                stack.worker(
                    queues="batches",
                    pool="threads",
                    concurrency=THREADS,
                    env=env,
                    prefix=host.run_prefix(),
                )
            model.reset_counters()

            # When a 6,000-key run is deleted
            run = finished(store, start(stack, cutoff))

            # Then every host deleted, nothing was lost, and S3 saw the budget's rate
            assert_all_deleted(run, s3, bucket)
            arrivals = model.arrivals()
            assert len(accepted_by_worker(arrivals)) == count
            assert model.throttled_requests == 0
            rates[count] = fleet_rate(arrivals)
            assert 0.9 * BUDGET <= rates[count] <= 1.1 * BUDGET, rates
            # Every worker of this stack stops, the sweep worker too: one configured for
            # this bucket would refuse the next run's slices as target_changed
            stack.stop()
    finally:
        for relay in relays:
            relay.stop()

    # And three hosts ran no slower than one
    assert rates[3] >= 0.9 * rates[1], rates
