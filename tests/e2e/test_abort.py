"""A stuck run can be inspected and aborted, leaving the same audit record as a purge."""

from __future__ import annotations

import json

import pytest

from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.conftest import list_keys, s3_targets, seed_split
from tests.rig.stack import wait_for

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(120)]


def test_a_stuck_run_is_aborted_with_an_audit_record_and_its_next_trigger_starts_over(
    make_stack, s3, bucket, redis_client
):
    # Given a run whose batches wait in a queue no worker serves
    s3.create_bucket(Bucket=f"{bucket}-audit")
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(s3_targets(bucket), env={"CLEANUP_AUDIT_URL": f"s3://{bucket}-audit/"})
    sweeper = stack.worker(queues="sweeps", concurrency=1)
    run_id = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json").json()[
        "run_id"
    ]
    wait_for(lambda: redis_client.llen("batches") == 1, 60, "the batch to wait in its queue")
    sweeper.stop()
    assert stack.cli("status", run_id, "--json").json()["inflight"] == 1

    # When an operator aborts it, first without confirming
    refused = stack.cli("abort", run_id, "--reason", "batches worker gone")
    aborted = stack.cli("abort", run_id, "--reason", "batches worker gone", "--yes", "--json")

    # Then only the confirmed abort acts: the run is failed as aborted, with who and why
    assert refused.code == 2
    assert "--yes" in refused.stderr
    run = aborted.json()
    assert (run["status"], run["reason"]) == ("failed", "aborted"), aborted
    assert "batches worker gone" in run["message"]
    record = Runtime(Settings.from_env(stack.env)).dead_letters.audit_log()[0]
    assert (record["action"], record["reason"]) == ("abort", "batches worker gone")
    assert record["run"]["status"] == "running"
    key = run["audit_url"].removeprefix(f"s3://{bucket}-audit/")
    kept = json.loads(s3.get_object(Bucket=f"{bucket}-audit", Key=key)["Body"].read())
    assert kept[0]["run"]["run_id"] == run_id
    # and a second abort is refused: the run is no longer running
    assert stack.cli("abort", run_id, "--reason", "again", "--yes").code == 2

    # When the run is triggered again with workers for everything
    redis_client.delete("batches")
    stack.worker()
    again = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then it starts over and deletes every key
    assert again.json()["action"] == "restarted", again
    assert again.json()["deleted"] == 120
    assert list_keys(s3, bucket) == set()
