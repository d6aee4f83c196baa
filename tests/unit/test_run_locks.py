"""The sweep lease and slot locks: one holder each, kept under the keys and values stored so far.

Both are redis-py locks with an explicit token.  A running deployment's Redis
holds leases and claims written before that, and the checkpoint script reads the
lease key itself, so the key names, the stored values and the expiry must stay.
"""

from __future__ import annotations

import pytest
import redis

from digest_cleanup.store.runs import RunStore
from digest_cleanup.store.sweeps import StageFenced

RUN = "statements-20261129T0300Z"


def _open(store: RunStore) -> None:
    assert store.runs.open(RUN, {"target": "statements"}) == "created"


def test_the_lease_is_the_fence_stored_at_the_run_lease_key(redis_client: redis.Redis) -> None:
    # Given a run store
    store = RunStore(redis_client)

    # When a slice takes the sweep lease for 30 seconds
    fence = store.sweeps.take_lease(RUN, 30)

    # Then the fence is the plain value at dc:run:ID:sweep_lease, expiring in 30 s
    assert fence is not None
    assert redis_client.get(f"dc:run:{RUN}:sweep_lease") == fence.encode()
    assert 29_000 < redis_client.pttl(f"dc:run:{RUN}:sweep_lease") <= 30_000


def test_one_slice_holds_the_lease_and_only_its_fence_releases_it(
    redis_client: redis.Redis,
) -> None:
    # Given a lease taken by one slice
    store = RunStore(redis_client)
    fence = store.sweeps.take_lease(RUN, 30)
    assert fence is not None

    # Then another slice cannot take it, and only the fence holds it
    assert store.sweeps.take_lease(RUN, 30) is None
    assert store.sweeps.holds_lease(RUN, fence)
    assert not store.sweeps.holds_lease(RUN, "another-fence")

    # When another fence releases it, it stays; when its own does, it is free
    store.sweeps.release_lease(RUN, "another-fence")
    assert store.sweeps.holds_lease(RUN, fence)
    store.sweeps.release_lease(RUN, fence)
    assert not store.sweeps.holds_lease(RUN, fence)
    assert redis_client.exists(f"dc:run:{RUN}:sweep_lease") == 0
    assert store.sweeps.take_lease(RUN, 30) is not None


def test_releasing_a_lost_lease_changes_nothing(redis_client: redis.Redis) -> None:
    # Given a lease that expired and was taken by a redelivered slice
    store = RunStore(redis_client)
    stale = store.sweeps.take_lease(RUN, 30)
    assert stale is not None
    redis_client.delete(f"dc:run:{RUN}:sweep_lease")
    current = store.sweeps.take_lease(RUN, 30)
    assert current is not None

    # When the stale slice gives its lease back
    store.sweeps.release_lease(RUN, stale)

    # Then the current holder keeps it
    assert store.sweeps.holds_lease(RUN, current)


def test_the_checkpoint_script_accepts_the_lease_fence_and_fences_any_other(
    redis_client: redis.Redis,
) -> None:
    # Given a run whose sweep lease a slice holds
    store = RunStore(redis_client)
    _open(store)
    fence = store.sweeps.take_lease(RUN, 30)
    assert fence is not None
    checkpoint = {"listed": 3, "expired": 2, "seq": 1, "done": False}

    # Then its checkpoint is saved, renewing the lease, and another fence's is refused
    redis_client.pexpire(f"dc:run:{RUN}:sweep_lease", 5_000)
    assert (
        store.sweeps.save_checkpoint(RUN, checkpoint, {}, lease=fence, lease_seconds=60) == "saved"
    )
    assert redis_client.pttl(f"dc:run:{RUN}:sweep_lease") > 59_000
    assert (
        store.sweeps.save_checkpoint(RUN, checkpoint, {}, lease="another-fence", lease_seconds=60)
        == "fenced"
    )


def test_a_slot_is_claimed_once_and_again_by_the_same_holder(redis_client: redis.Redis) -> None:
    # Given a run store
    store = RunStore(redis_client)

    # When a trigger claims a slot, and its redelivery and another trigger claim it too
    first = store.targets.lock_slot("statements", "20261129T0300Z", "task-1", 3600)
    again = store.targets.lock_slot("statements", "20261129T0300Z", "task-1", 3600)
    other = store.targets.lock_slot("statements", "20261129T0300Z", "task-2", 3600)

    # Then the first holder has it (its redelivery too), the other does not, and the
    # claim is the holder's id at dc:slot:TARGET:SLOT for the time asked
    assert (first, again, other) == (True, True, False)
    assert redis_client.get("dc:slot:statements:20261129T0300Z") == b"task-1"
    assert 3_599 < redis_client.ttl("dc:slot:statements:20261129T0300Z") <= 3_600


def test_only_the_holder_frees_a_slot(redis_client: redis.Redis) -> None:
    # Given a slot locked by one trigger
    store = RunStore(redis_client)
    assert store.targets.lock_slot("statements", "20261129T0300Z", "task-1", 3600)

    # When another trigger frees it, it stays claimed
    store.targets.unlock_slot("statements", "20261129T0300Z", "task-2")
    assert not store.targets.lock_slot("statements", "20261129T0300Z", "task-2", 3600)

    # When its holder frees it, the next trigger can claim it
    store.targets.unlock_slot("statements", "20261129T0300Z", "task-1")
    assert store.targets.lock_slot("statements", "20261129T0300Z", "task-2", 3600)
    store.targets.unlock_slot("statements", "20261129T0300Z", "task-1")  # no longer its: a no-op
    assert redis_client.get("dc:slot:statements:20261129T0300Z") == b"task-2"


def test_a_slice_that_lost_the_lease_stages_and_trims_nothing(redis_client: redis.Redis) -> None:
    # Given a slice whose lease expired, and the slice that took over and trimmed the stage
    store = RunStore(redis_client)
    _open(store)
    old = store.sweeps.take_lease(RUN, 30)
    assert old is not None
    assert store.sweeps.stage(RUN, [[["statements/a.pdf", '"e1"']]], lease=old) == 1
    redis_client.delete(f"dc:run:{RUN}:sweep_lease")  # the lease ran out
    new = store.sweeps.take_lease(RUN, 30)
    assert new is not None
    store.sweeps.keep_staged(RUN, 0, lease=new)

    # When the old slice, still running, appends a batch and trims the stage
    with pytest.raises(StageFenced):
        store.sweeps.stage(RUN, [[["statements/b.pdf", '"e2"']]], lease=old)
    assert store.sweeps.stage(RUN, [[["statements/c.pdf", '"e3"']]], lease=new) == 1
    with pytest.raises(StageFenced):
        store.sweeps.keep_staged(RUN, 0, lease=old)

    # Then the stage holds only what the lease's holder staged
    assert store.sweeps.staged(RUN, 0, 10) == [[["statements/c.pdf", '"e3"']]]


def test_a_checkpoint_keeps_each_batch_s_first_published_digest(redis_client: redis.Redis) -> None:
    # Given a run whose sweep put a batch in flight with its digest
    store = RunStore(redis_client)
    _open(store)
    fence = store.sweeps.take_lease(RUN, 30)
    assert fence is not None
    checkpoint = {"listed": 1, "expired": 1, "seq": 1, "done": False}
    batch = f"{RUN}-b00001"
    store.sweeps.save_checkpoint(RUN, checkpoint, {batch: b"first"}, lease=fence, lease_seconds=60)

    # When a resumed slice sends the same chunk again, and a fenced one tries another digest
    store.sweeps.save_checkpoint(RUN, checkpoint, {batch: b"again"}, lease=fence, lease_seconds=60)
    store.sweeps.save_checkpoint(
        RUN, checkpoint, {batch: b"forged"}, lease="other", lease_seconds=60
    )

    # Then the batch is counted in flight once and keeps the digest it was published with
    assert store.sweeps.published_digest(RUN, batch) == b"first"
    assert store.sweeps.published_digest(RUN, f"{RUN}-b00002") is None
    assert store.runs.get(RUN).count("inflight") == 1
