"""The deletion-safety contract on the real stack: S3 confirms each delete, workers refuse
what their own configuration and clock do not allow, and nothing is assumed gone."""

from __future__ import annotations

import base64
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.app import create_app
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.settings import Settings
from tests.conftest import dlq_entries as _entries
from tests.conftest import finished_run as _finished
from tests.conftest import list_keys, put_keys, s3_targets, scope_of, seed_split
from tests.conftest import run_status as _status
from tests.conftest import sweep_only as _sweep_only
from tests.rig.stack import wait_for

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(1000)]
REWRITTEN = b"%PDF-1.7 re-rendered after the listing"


def _body(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_keys_rewritten_after_listing_survive_and_are_reported(
    make_stack, s3, bucket, redis_client
):
    # Given a run whose batches are queued, and 200 keys re-rendered before they run
    s3.create_bucket(Bucket=f"{bucket}-audit")
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(
        s3_targets(bucket), env={"CLEANUP_AUDIT_URL": f"s3://{bucket}-audit/reports/"}
    )
    run_id = _sweep_only(stack, redis_client, cutoff, batches=2)
    rewritten = KEYS[::5]
    put_keys(s3, bucket, rewritten, body=REWRITTEN)

    # When the batches are deleted
    stack.worker()
    run = _finished(stack, run_id)

    # Then the rewritten keys are kept with their new content, the rest of their
    # batches is deleted, and the accounting adds up with them as skipped; a fifth of
    # the run skipped is more than the default max_skipped_share (a tenth) allows, so
    # the run is not complete
    assert list_keys(s3, bucket) == set(rewritten)
    assert all(_body(s3, bucket, key) == REWRITTEN for key in rewritten[:20])
    assert (run["expired"], run["deleted"], run["skipped"], run["dead_lettered"]) == (
        1000,
        800,
        200,
        0,
    )
    assert (run["status"], run["reason"]) == (
        "complete_with_failures",
        "max_skipped_share_exceeded",
    )
    assert "200 of 1000" in run["message"]
    assert run["conditional_deletes"] is True
    assert _entries(stack) == []  # kept on purpose: never retried, never dead-lettered
    # and the audit report names each of them, with why
    prefix = run["report_url"].removeprefix(f"s3://{bucket}-audit/")
    assert prefix.startswith(f"reports/statements/{run_id}/")
    rows = s3.get_object(Bucket=f"{bucket}-audit", Key=prefix + "not_deleted.jsonl")["Body"]
    lines = [json.loads(line) for line in rows.read().decode().splitlines()]
    assert {(r["key"], r["code"]) for r in lines} == {
        (k, "changed_since_listing") for k in rewritten
    }


def test_a_dead_letter_redriven_after_its_keys_were_rewritten_keeps_them(
    make_stack, s3, bucket, proxy
):
    # Given 5 keys dead-lettered by a denial, then re-rendered while they waited
    denied = KEYS[10:15]
    cutoff = seed_split(s3, bucket, KEYS[:100], [])
    proxy.deny_keys = set(denied)
    stack = make_stack(s3_targets(bucket))
    stack.worker()
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["dead_lettered"] == 5
    put_keys(s3, bucket, denied, body=REWRITTEN)

    # When the cause is fixed and the entries are redriven
    proxy.deny_keys = set()
    assert stack.cli("dlq", "redrive", "--all", "--json").code == 0
    after = wait_for(
        lambda: (s := _status(stack, run["run_id"]))["status"] == "complete" and s,
        60,
        "the redriven run to complete",
    )

    # Then the re-rendered keys survive with their new content, counted as skipped
    assert list_keys(s3, bucket) == set(denied)
    assert {_body(s3, bucket, key) for key in denied} == {REWRITTEN}
    assert (after["deleted"], after["skipped"], after["dead_lettered"]) == (95, 5, 0)


def test_a_batch_delivered_again_after_its_run_completed_deletes_nothing(
    make_stack, s3, bucket, redis_client
):
    # Given a completed run, and a copy of one of its batch messages as first queued
    cutoff = seed_split(s3, bucket, KEYS[:500], [])
    stack = make_stack(s3_targets(bucket))
    run_id = _sweep_only(stack, redis_client, cutoff, batches=1)
    (message,) = redis_client.lrange("batches", 0, -1)
    stack.worker()
    assert _finished(stack, run_id)["deleted"] == 500
    # and the same keys written afresh since
    put_keys(s3, bucket, KEYS[:500], body=REWRITTEN)

    # When the old message is delivered again, as a fresh attempt (not a known duplicate)
    raw = json.loads(message)
    body = json.loads(base64.b64decode(raw["body"]))
    replay = BatchPayload.from_message(body[1])
    app = create_app(Settings.from_env(stack.env))
    app.send_task(
        "digest_cleanup.delete_batch",
        kwargs=dataclasses.replace(replay, attempt=7).to_message(),
        queue="batches",
    )
    entry = wait_for(
        lambda: next((e for e in _entries(stack) if e["run_id"] == run_id), None),
        30,
        "the replay to be refused",
    )

    # Then it is refused before any delete (its run has ended), counted nowhere, and
    # every key it named is still there, with its new content
    assert entry["reason"] == "run_ended", entry
    assert _status(stack, run_id)["deleted"] == 500
    assert _status(stack, run_id)["dead_lettered"] == 0
    assert list_keys(s3, bucket) == set(KEYS[:500])
    assert {_body(s3, bucket, key) for key in KEYS[:3]} == {REWRITTEN}


def test_a_cutoff_inside_the_retention_window_is_refused_by_cli_and_worker(
    make_stack, s3, bucket, proxy
):
    # Given fresh objects of a target that keeps them 30 days
    fresh = KEYS[:50]
    put_keys(s3, bucket, fresh)
    stack = make_stack(s3_targets(bucket).replace("retention_days = 0", "retention_days = 30"))
    stack.worker()
    now = datetime.now(UTC).replace(microsecond=0)

    # When a run is asked for with a cutoff of now
    refused = stack.cli("run", "statements", "--cutoff", now.isoformat(), "--json")

    # Then the CLI refuses it up front, naming the retention and the latest allowed cutoff
    assert refused.code == 2, refused
    assert "retention_days = 30" in refused.stderr
    latest = (now - timedelta(days=30)).isoformat()[:13]
    assert latest in refused.stderr, refused.stderr

    # When a batch carrying that cutoff is published straight to the work queue
    forged = BatchPayload(
        run_id=f"statements-{now:%Y%m%dT%H%M%SZ}",
        target="statements",
        batch_id="forged-b00001",
        seq=1,
        cutoff=now.isoformat(),
        keys=fresh,
        scope=scope_of(stack, "statements"),
    )
    app = create_app(Settings.from_env(stack.env))
    app.send_task("digest_cleanup.delete_batch", kwargs=forged.to_message(), queue="batches")

    # Then the worker refuses it whole: it is dead-lettered with every key, nothing deleted
    (entry,) = wait_for(lambda: _entries(stack), 30, "the refused batch")
    assert entry["reason"] == "inside_retention"
    assert "retention_days = 30" in entry["message"]
    assert [k["key"] for k in entry["keys"]] == fresh
    assert proxy.delete_requests == 0
    assert list_keys(s3, bucket) == set(fresh)


def test_a_trigger_whose_now_lies_ahead_is_refused(make_stack, s3, bucket):
    # Given a worker, and a trigger sent by hand with a "now" a year ahead
    put_keys(s3, bucket, KEYS[:5])
    stack = make_stack(s3_targets(bucket).replace("retention_days = 0", "retention_days = 30"))
    stack.worker()
    app = create_app(Settings.from_env(stack.env))
    ahead = (datetime.now(UTC) + timedelta(days=365)).isoformat()

    # When it runs
    result = app.send_task("digest_cleanup.trigger", args=["statements", ahead], queue="sweeps")

    # Then no run is opened and nothing is deleted
    wait_for(
        lambda: "'action': 'refused'" in stack.processes[0].output(), 30, "the refused trigger"
    )
    assert result.id
    assert stack.cli("runs", "--json").json()["runs"] == []
    assert list_keys(s3, bucket) == set(KEYS[:5])


def test_a_batch_listed_before_its_target_changed_is_refused_kept_and_relisted(
    make_stack, s3, bucket, redis_client
):
    # Given queued batches of a run, and the target's prefix then changed
    cutoff = seed_split(s3, bucket, KEYS, [])
    stack = make_stack(s3_targets(bucket))
    run_id = _sweep_only(stack, redis_client, cutoff, batches=2)
    stack.targets_file.write_text(
        s3_targets(bucket).replace('prefix = "statements/"', 'prefix = "statements/2026-10-18/"')
    )

    # When workers with the new configuration take the batches
    stack.worker()
    run = _finished(stack, run_id)

    # Then both are refused whole and kept in the dead-letter queue, and nothing is deleted
    entries = _entries(stack)
    assert {e["reason"] for e in entries} == {"target_changed"}
    assert sorted(k["key"] for e in entries for k in e["keys"]) == KEYS
    assert list_keys(s3, bucket) == set(KEYS)
    assert run["dead_lettered"] == 1000

    # When the run is triggered again under the new configuration
    again = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then it lists afresh under the new prefix and deletes the keys
    assert again.json()["action"] == "restarted", again
    assert again.json()["deleted"] == 1000
    assert list_keys(s3, bucket) == set()


def test_overlapping_targets_and_an_audit_location_inside_a_target_stop_the_worker(
    make_stack, bucket
):
    # Given a targets file where one prefix lies inside another
    overlapping = s3_targets(bucket) + s3_targets(bucket, prefix="statements/eu/", name="eu")
    stack = make_stack(overlapping)

    # When a worker starts, and the CLI reads the file
    worker = stack.worker(ready=False)

    # Then both refuse, naming the two targets
    assert worker.proc.wait(60) == 2
    assert "targets.statements and targets.eu overlap" in worker.output()
    listed = stack.cli("targets")
    assert listed.code == 2
    assert "targets.statements and targets.eu overlap" in listed.stderr

    # And an audit location inside a target's scope is refused the same way
    inside = make_stack(
        s3_targets(bucket), env={"CLEANUP_AUDIT_URL": f"s3://{bucket}/statements/audit/"}
    )
    result = inside.cli("targets")
    assert result.code == 2
    assert "CLEANUP_AUDIT_URL" in result.stderr
    assert "targets.statements" in result.stderr


def test_a_key_xml_cannot_carry_is_deleted_alone_and_the_rest_of_its_batch_normally(
    make_stack, s3, bucket, proxy
):
    # Given expired keys, two of them with characters an XML 1.0 body cannot carry
    odd = ["statements/2026-10-18/ctrl\x01char.pdf", "statements/2026-10-18/cr\rreturn.pdf"]
    keys = [*KEYS[:98], *odd]
    cutoff = seed_split(s3, bucket, keys, [])
    assert set(odd) <= list_keys(s3, bucket)
    stack = make_stack(s3_targets(bucket))
    stack.worker()

    # When the run deletes them
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()

    # Then every key is gone: the batch was not failed as malformed, and nothing dead-lettered
    assert run["status"] == "complete", run
    assert (run["deleted"], run["dead_lettered"]) == (100, 0)
    assert list_keys(s3, bucket) == set()
    assert proxy.delete_requests == 1  # one DeleteObjects for the 98; the odd ones went alone


def test_check_proves_whether_the_endpoint_honours_conditional_deletes(
    make_stack, weed, s3, bucket, proxy
):
    # Given a target reached straight, and one reached through a proxy that drops conditions
    direct = make_stack(s3_targets(bucket), direct_s3=weed.endpoint_url)
    stripped = make_stack(s3_targets(bucket))
    proxy.strip_conditions = True

    # When each is checked
    honoured = direct.cli("check", "statements", "--json")
    ignored = stripped.cli("check", "statements", "--json")

    # Then the first reports the condition honoured, and the second not, as a problem
    findings = {f["check"]: f for f in honoured.json()["findings"]}
    assert honoured.code == 0, honoured
    assert findings["conditional deletes"]["status"] == "ok"
    assert findings["credentials and bucket"]["status"] == "ok"
    assert findings["redis eviction policy"]["status"] == "ok"
    bad = {f["check"]: f for f in ignored.json()["findings"]}
    assert ignored.code == 1, ignored
    assert bad["conditional deletes"]["status"] == "problem"
    assert "NOT honoured" in bad["conditional deletes"]["detail"]
    # and neither left its probe behind
    assert list_keys(s3, bucket) == set()
