"""Audit reports are records: a restarted or redriven run never overwrites an earlier one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import list_keys, s3_targets, seed_split
from tests.rig.stack import wait_for

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:04d}.pdf" for i in range(20)]


def _summary(s3: Any, bucket: str, key: str) -> dict[str, Any]:
    return dict(json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))


def test_a_restarted_and_a_redriven_run_each_leave_a_report_of_their_own(
    make_stack, s3, bucket, proxy
):
    # Given an audit location, and a target whose max_delete the run will exceed
    audit = f"{bucket}-audit"
    s3.create_bucket(Bucket=audit)
    cutoff = seed_split(s3, bucket, KEYS, []).isoformat()
    stack = make_stack(
        s3_targets(bucket, max_delete=10), env={"CLEANUP_AUDIT_URL": f"s3://{audit}/reports/"}
    )
    stack.worker()

    # When the run fails, is restarted under the same run id with S3 denying 3 keys,
    # and its dead letters are redriven once S3 allows them
    failed = stack.cli("run", "statements", "--cutoff", cutoff, "--wait", "--json").json()
    assert (failed["status"], failed["reason"]) == ("failed", "max_delete_exceeded")
    proxy.deny_keys = set(KEYS[:3])
    restarted = stack.cli(
        "run", "statements", "--cutoff", cutoff, "--force", "--wait", "--json"
    ).json()
    assert (restarted["action"], restarted["status"]) == ("restarted", "complete_with_failures")
    assert restarted["run_id"] == failed["run_id"]
    proxy.deny_keys = set()
    assert stack.cli("dlq", "redrive", "--all", "--json").code == 0
    redriven = wait_for(
        lambda: (
            (s := stack.cli("status", failed["run_id"], "--json").json())["status"] == "complete"
            and s.get("report_url") not in (None, "", restarted["report_url"])
            and s
        ),
        60,
        "the redriven run to complete and write its report",
    )

    # Then the run's folder holds three reports, each of its own incarnation and end,
    # and none was overwritten: each says what its incarnation did
    folder = f"reports/statements/{failed['run_id']}/"
    assert len({failed["report_url"], restarted["report_url"], redriven["report_url"]}) == 3
    objects = sorted(list_keys(s3, audit, folder))
    assert len(objects) == 6, objects
    summaries = [k for k in objects if k.endswith("/summary.json")]
    assert [k.removesuffix("summary.json") + "not_deleted.jsonl" for k in summaries] == [
        k for k in objects if k.endswith("/not_deleted.jsonl")
    ]
    reports = [_summary(s3, audit, key) for key in summaries]
    assert [(r["status"], r["deleted"]) for r in reports] == [
        ("failed", 0),
        ("complete_with_failures", 17),
        ("complete", 20),
    ]
    # and each state pointed at its own report, the run's now at the latest
    for run, report in zip((failed, restarted, redriven), reports, strict=True):
        prefix = run["report_url"].removeprefix(f"s3://{audit}/")
        assert _summary(s3, audit, prefix + "summary.json") == report
    assert reports[0]["token"] != reports[1]["token"] == reports[2]["token"]
    # and the redriven end names the report of the end before it (a restart starts
    # its state afresh, so only the folder's listing links it to the failed one)
    assert "previous_report_url" not in reports[0]
    assert reports[2]["previous_report_url"] == restarted["report_url"]
    assert list_keys(s3, bucket) == set()
