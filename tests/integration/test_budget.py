"""The shared delete budget on a real Redis: spacing, sharing, AIMD, pauses, refusals.

Two :class:`DeleteBudget` objects on two Redis clients stand for two worker
processes.  Waits are computed on Redis's clock, so the figures are checked to a
tolerance; where a test needs time to pass (the additive increase), it moves the
budget's own timestamps back instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.store.budget import (
    BURST_SECONDS,
    DECREASE_FACTOR,
    FLOOR_SHARE,
    INCREASE_SHARE,
    DeleteBudget,
    longest_wait,
)

CEILING = 1000.0
#: Seconds of slack for the Redis round trips between two reservations.
SLACK = 0.05


@pytest.fixture
def clients(redis_url: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    first, second = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    first.flushdb()
    yield first, second
    first.close()
    second.close()


def budget(client: redis.Redis, ceiling: float = CEILING, **kwargs: object) -> DeleteBudget:
    return DeleteBudget(client, "dc", "statements", ceiling, **kwargs)  # type: ignore[arg-type]


def test_reservations_are_spaced_at_the_rate_after_one_burst(clients):
    # Given an idle budget of 1,000 keys/s
    b = budget(clients[0])

    # When five 500-key batches reserve at once
    grants = [b.reserve(500, max_wait=30) for _ in range(5)]

    # Then each waits half a second more than the one before, less the burst allowance
    for n, grant in enumerate(grants, start=1):
        assert grant.granted
        assert grant.wait == pytest.approx(n * 0.5 - BURST_SECONDS, abs=SLACK)
    assert b.state().reserved_keys == 2500


def test_two_processes_share_one_budget(clients):
    # Given the same target's budget in two processes
    a, b = budget(clients[0]), budget(clients[1])

    # When they reserve in turn
    waits = [(a if n % 2 == 0 else b).reserve(500, max_wait=30).wait for n in range(4)]

    # Then they queue behind each other, as one process's reservations would
    assert waits == sorted(waits)
    assert waits[-1] == pytest.approx(4 * 0.5 - BURST_SECONDS, abs=SLACK)


def test_a_slowdown_lowers_the_rate_for_everyone_once_per_signal(clients):
    a, b = budget(clients[0]), budget(clients[1])
    a.reserve(500, max_wait=30)

    # When both processes report SlowDown for the same burst of requests
    a.throttled()
    b.throttled()

    # Then the shared rate fell once, both see it, and both reports were counted
    assert a.state().rate == pytest.approx(CEILING * DECREASE_FACTOR)
    state = b.state()
    assert (state.rate, state.throttles, state.decreases) == (
        pytest.approx(CEILING * DECREASE_FACTOR),
        2,
        1,
    )
    # And the next reservation waits a full interval at the lower rate: no burst
    assert b.reserve(700, max_wait=30).wait == pytest.approx(1.0, abs=SLACK)


def test_a_waiting_batch_reserves_again_when_the_budget_was_lowered_meanwhile(clients):
    # Given a batch that must wait for its reservation
    other = budget(clients[1])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 1:
            other.throttled()  # another worker hits SlowDown while this one waits

    waiting = budget(clients[0], sleep=sleep)
    waiting.reserve(1000, max_wait=30)

    # When it draws and the rate drops while it sleeps
    drawn = waiting.draw(500, max_wait=30)

    # Then it did not send on its old reservation but reserved again, at the new rate
    assert drawn.granted
    assert len(slept) == 2
    assert drawn.rate == pytest.approx(CEILING * DECREASE_FACTOR)
    assert drawn.waited == pytest.approx(sum(slept))


def test_retry_after_pauses_the_budget_and_a_long_wait_is_refused_not_reserved(clients):
    a, b = budget(clients[0]), budget(clients[1])

    # When S3 says to retry after 2 seconds
    a.throttled(pause=2.0)

    # Then the other process's next batch waits at least that long
    assert b.state().paused_for == pytest.approx(2.0, abs=SLACK)
    assert b.reserve(10, max_wait=30).wait >= 2.0 - SLACK
    # And one that may wait only a second is refused, and reserves nothing
    before = b.state().reserved_keys
    refused = b.reserve(10, max_wait=1.0)
    assert not refused.granted
    assert refused.wait > 1.0
    after = b.state()
    assert (after.reserved_keys, after.deferred, after.pauses) == (before, 1, 1)
    # And draw() hands it back without sleeping
    slept: list[float] = []
    assert not budget(clients[1], sleep=slept.append).draw(10, max_wait=1.0).granted
    assert slept == []


def test_sustained_success_raises_the_rate_back_to_the_ceiling(clients):
    b = budget(clients[0])
    b.throttled()
    lowered = b.state().rate

    # When three increase intervals pass without a SlowDown
    clients[0].hincrbyfloat(b.key, "changed_at", -3.0)

    # Then the rate rose by three steps, and never past the ceiling
    assert b.state().rate == pytest.approx(lowered + 3 * INCREASE_SHARE * CEILING)
    clients[0].hincrbyfloat(b.key, "changed_at", -60.0)
    assert b.state().rate == CEILING
    assert b.reserve(1, max_wait=30).rate == CEILING


def test_the_rate_never_falls_below_its_floor(clients):
    b = budget(clients[0])
    for _ in range(40):
        clients[0].hset(b.key, "decreased_at", 0)  # each a separate signal
        b.throttled()
    assert b.state().rate == pytest.approx(CEILING * FLOOR_SHARE)


def test_a_new_ceiling_from_the_targets_file_applies_at_once(clients):
    budget(clients[0], ceiling=1000).reserve(1, max_wait=30)
    assert budget(clients[1], ceiling=400).reserve(1, max_wait=30).rate == 400
    assert budget(clients[1], ceiling=2000).reserve(1, max_wait=30).rate == 2000


def test_report_lowers_the_rate_only_for_throttle_codes_and_pauses_for_retry_after(clients):
    b = budget(clients[0])
    codes = frozenset({"SlowDown"})
    b.report([KeyResult("a", Outcome.TRANSIENT, "InternalError")], codes)
    assert b.state().throttles == 0
    b.report(
        [
            KeyResult("a", Outcome.DELETED),
            KeyResult("b", Outcome.TRANSIENT, "SlowDown", retry_after=1.5),
        ],
        codes,
    )
    state = b.state()
    assert (state.throttles, state.pauses) == (1, 1)
    assert state.paused_for == pytest.approx(1.5, abs=SLACK)


def test_a_held_message_never_waits_past_a_share_of_the_visibility_timeout():
    assert longest_wait(300) == 30.0
    assert longest_wait(6) == pytest.approx(1.5)
