"""A run proves the store honours delete conditions before it deletes, on the real stack.

A target's first run, and its first after its scope changes, runs the probe of
``digest-cleanup check`` itself: through a proxy that strips conditions (as a
server that ignores them without saying so), the run is refused and nothing is
deleted; with the proxy honest it probes, passes and runs, and the next run of the
same scope does not probe again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.store.runs import RunStore
from tests.conftest import list_keys, put_keys, s3_targets, seed_split
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(200)]
LATER = [f"statements/2026-10-25/cust-{i:06d}.pdf" for i in range(50)]


def _run(stack: Stack, cutoff: Any) -> tuple[int, dict[str, Any]]:
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    return result.code, dict(result.json())


def test_a_store_that_ignores_conditions_refuses_the_first_run_and_deletes_nothing(
    make_stack, s3, bucket, proxy, redis_client
):
    # Given expired keys behind a store that drops every delete condition
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(s3_targets(bucket))
    stack.worker()
    proxy.strip_conditions = True

    # When the target's first run is started
    code, run = _run(stack, cutoff)

    # Then it ends failed before listing, says why and what to set, and deletes nothing
    assert code == 3, run
    assert (run["status"], run["reason"]) == ("failed", "conditions_not_honoured"), run
    assert run["action"] == "refused"
    assert "NOT honoured by DeleteObjects, DeleteObject" in run["message"]
    assert "conditional_deletes = false" in run["message"]
    assert "nothing deleted" in run["message"]
    assert (run["listed"], run["deleted"]) == (0, 0)
    assert proxy.probe_requests > 0
    assert proxy.delete_requests == 0
    assert list_keys(s3, bucket) == set(KEYS), "every key kept, and no probe object left"
    assert RunStore(redis_client).targets.probed_scope("statements") is None

    # And when the store is honest again, the same run is probed anew, passes and runs
    proxy.strip_conditions = False
    code, run = _run(stack, cutoff)
    assert code == 0, run
    assert (run["status"], run["action"], run["deleted"]) == ("complete", "restarted", 200)
    assert list_keys(s3, bucket) == set()


def test_the_first_run_probes_and_the_next_run_of_the_same_scope_does_not(
    make_stack, s3, bucket, proxy, redis_client
):
    # Given a target never run, behind an honest store
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(s3_targets(bucket))
    stack.worker()

    # When its first run runs
    code, first = _run(stack, cutoff)

    # Then it probed, passed, deleted, and recorded the scope it proved
    assert code == 0, first
    assert (first["status"], first["deleted"]) == ("complete", len(KEYS)), first
    assert proxy.probe_requests > 0
    assert RunStore(redis_client).targets.probed_scope("statements") == first["scope"]

    # And when the next run of the same scope starts, with the store now stripping
    # conditions (a probe would refuse the run), it sends no probe and runs
    later = seed_split(s3, bucket, LATER, [])
    # The workers' trusted clock may read S3's whole-second Date a second early.
    wait_for(lambda: datetime.now(UTC) > later + timedelta(seconds=2), 5, "the clock")
    proxy.reset_counters()
    proxy.strip_conditions = True
    code, second = _run(stack, later)
    assert code == 0, (second.get("reason"), second.get("message"))
    assert (second["status"], second["deleted"]) == ("complete", len(LATER)), second
    assert proxy.probe_requests == 0
    assert list_keys(s3, bucket) == set()


def test_a_changed_scope_and_an_emptied_redis_probe_again(
    make_stack, s3, bucket, proxy, redis_client
):
    # Given a target whose scope was proved, behind a store that now strips conditions
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(s3_targets(bucket))
    stack.worker()
    code, first = _run(stack, cutoff)
    assert code == 0, first
    proxy.strip_conditions = True

    # When its scope changes (another prefix), the first run under it probes and is refused
    put_keys(s3, bucket, [f"receipts/{i}.json" for i in range(5)])
    moved = make_stack(s3_targets(bucket, prefix="receipts/"))  # refused before any worker
    code, refused = _run(moved, seed_split(s3, bucket, [], []))
    assert (code, refused["reason"]) == (3, "conditions_not_honoured"), refused
    assert len(list_keys(s3, bucket, "receipts/")) == 5

    # And when Redis forgets the proved scope, the old scope is probed again too
    store = RunStore(redis_client)
    redis_client.delete(store.key("target", "statements", "probed"))
    put_keys(s3, bucket, LATER)
    code, again = _run(stack, seed_split(s3, bucket, [], []))
    assert (code, again["reason"]) == (3, "conditions_not_honoured"), again
    assert list_keys(s3, bucket, "statements/") == set(LATER)


def test_an_opted_out_target_runs_unconditionally_without_a_probe(make_stack, s3, bucket, proxy):
    # Given a store that ignores conditions, and a target that accepts that risk
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(s3_targets(bucket, conditional_deletes=False))
    stack.worker()
    proxy.strip_conditions = True

    # When its first run runs
    code, run = _run(stack, cutoff)

    # Then it is not probed, and deletes as configured, saying so in its status
    assert code == 0, run
    assert (run["status"], run["deleted"]) == ("complete", len(KEYS)), run
    assert run["conditional_deletes"] is False
    assert proxy.probe_requests == 0


def test_a_probe_that_cannot_finish_refuses_the_run_and_names_the_error(make_stack):
    # Given a target whose bucket does not exist, so no probe object can be written
    stack = make_stack(s3_targets("no-such-bucket-anywhere"))

    # When its first run is started
    result = stack.cli("run", "statements", "--wait", "--json", "--timeout", "60")

    # Then it is refused at once as unproven, with the store's answer, what the probe
    # needs, and what to run once it is fixed
    assert result.code == 3, result
    run = result.json()
    assert (run["status"], run["reason"], run["action"]) == (
        "failed",
        "conditions_unproven",
        "refused",
    ), run
    assert "the probe could not finish: AccessDenied" in run["message"]  # weed's answer
    assert "needs s3:PutObject" in run["message"]
    assert "digest-cleanup check statements" in run["message"]
