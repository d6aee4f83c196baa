"""Dead letters ops can act on, poison messages, and the audit report, on the real stack."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
import redis

from digest_cleanup.app import create_app
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.ops.redrive import redrive_entries
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.conftest import list_keys, s3_targets, scope_of, seed_split
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(1200)]


def _send(stack: Stack, kwargs: Any, task_id: str | None = None) -> None:
    app = create_app(Settings.from_env(stack.env))
    app.send_task("digest_cleanup.delete_batch", kwargs=kwargs, queue="batches", task_id=task_id)


def _entries(stack: Stack, *args: str) -> list[dict[str, Any]]:
    result = stack.cli("dlq", "list", "--json", *args)
    assert result.code == 0, result
    return list(result.json()["entries"])


def test_denied_keys_are_listed_redriven_after_the_fix_and_fold_back_into_the_run(
    make_stack, s3, bucket, proxy
):
    # Given a run in which S3 denies exactly 7 keys
    denied = {KEYS[i] for i in (0, 99, 250, 499, 500, 777, 1199)}
    cutoff = seed_split(s3, bucket, KEYS, [])
    proxy.deny_keys = denied
    stack = make_stack(s3_targets(bucket))
    stack.worker()
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["status"] == "complete_with_failures"

    # When ops list the dead letters
    entries = _entries(stack)

    # Then they see exactly those 7 keys with AccessDenied, their run and attempts
    listed = {k["key"]: k["code"] for e in entries for k in e["keys"]}
    assert listed == dict.fromkeys(denied, "AccessDenied")
    assert {e["run_id"] for e in entries} == {run["run_id"]}
    assert all(
        e["attempts"] == 1 and e["first_failure_at"] and e["last_failure_at"] for e in entries
    )
    # and listing twice shows the same thing: a peek consumes nothing
    assert _entries(stack) == entries
    assert _entries(stack, "--error", "AccessDenied") == entries
    assert _entries(stack, "--error", "SlowDown") == []
    shown = stack.cli("dlq", "show", entries[0]["id"], "--json").json()
    assert shown["keys"] == entries[0]["keys"]

    # When the cause is fixed and everything is redriven
    proxy.deny_keys = set()
    dry = stack.cli("dlq", "redrive", "--all", "--dry-run", "--json").json()
    assert sorted(dry["selected"]) == sorted(e["id"] for e in entries)
    assert dry["redriven"] == []
    assert len(_entries(stack)) == len(entries)
    redrive = stack.cli("dlq", "redrive", "--all", "--json").json()
    assert sorted(redrive["redriven"]) == sorted(e["id"] for e in entries)

    # Then the keys are deleted, the queue is empty and the run reads complete
    status = wait_for(
        lambda: (
            (s := stack.cli("status", run["run_id"], "--json").json())["status"] == "complete" and s
        ),
        60,
        "the redriven run to complete",
    )
    assert status["redriven"] == 7
    assert status["dead_lettered"] == 0
    assert status["deleted"] == 1200
    assert _entries(stack) == []
    assert list_keys(s3, bucket) == set()


def test_a_redrive_that_crashes_midway_loses_no_entry(make_stack, s3, bucket, proxy, redis_url):
    # Given 12 dead-letter entries (every key of a run denied, batches of 100)
    cutoff = seed_split(s3, bucket, KEYS, [])
    proxy.deny_keys = set(KEYS)
    stack = make_stack(s3_targets(bucket, batch_size=100))
    stack.worker()
    stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    stack.stop()  # no worker: redriven entries stay on the work queue where we can see them
    runtime = Runtime(Settings.from_env(stack.env))
    dlq = runtime.dead_letters
    entries = dlq.entries()
    assert len(entries) == 12

    # When a redrive dies after moving five entries
    class Crash(Exception):
        pass

    def dying() -> Any:
        for n, entry in enumerate(entries):
            if n == 5:
                raise Crash
            yield entry

    with pytest.raises(Crash):
        redrive_entries(runtime, dying(), dry_run=False)

    # Then every entry is in exactly one of the two queues
    client = redis.Redis.from_url(redis_url)
    work = [json.loads(m)["headers"]["id"] for m in client.lrange("batches", 0, -1)]
    left = [e.id for e in dlq.entries()]
    assert len(work) == 5
    assert len(left) == 7
    assert sorted(work + left) == sorted(e.id for e in entries)
    run = runtime.store.runs.get(entries[0].run_id)
    assert run.count("redriven") == 500
    assert run.count("dead_lettered") == 700


def test_poison_messages_are_dead_lettered_with_a_reason_and_the_worker_keeps_going(
    make_stack, s3, bucket, proxy
):
    # Given a worker and a bucket with keys both inside and outside the prefix
    cutoff = seed_split(s3, bucket, KEYS[:300], [])
    from tests.conftest import put_keys

    put_keys(s3, bucket, ["receipts/keep-me.json"])
    stack = make_stack(s3_targets(bucket))
    worker = stack.worker()
    good = BatchPayload(
        run_id="statements-20261122T030000Z",
        target="statements",
        batch_id="forged-b00001",
        seq=1,
        cutoff=cutoff.isoformat(),
        keys=KEYS[:3],
        scope=scope_of(stack, "statements"),
    )

    def forged(name: str, **changes: Any) -> dict[str, Any]:
        return dataclasses.replace(good, batch_id=f"forged-{name}", **changes).to_message()

    # When poison and refused batches are put straight onto the work queue
    _send(stack, {"hello": "world"}, "poison-malformed")
    _send(stack, forged("target") | {"target": "nope"}, "refused-target")
    _send(stack, forged("scope", keys=[KEYS[0], "receipts/keep-me.json"]), "refused-scope")
    big = forged("big", keys=[f"statements/x{i}" for i in range(1001)])
    _send(stack, big, "poison-big")
    _send(stack, forged("norun"), "refused-norun")

    # Then each is dead-lettered with its reason, and nothing was deleted; a batch no run
    # can vouch for gets an entry id of its own, so it never merges into a real entry
    expected = {
        "dl-poison-poison-malformed": "malformed",
        "dl-refused-forged-target": "unknown_target",
        "dl-refused-forged-scope": "out_of_scope",
        "dl-poison-poison-big": "too_many_keys",
        "dl-refused-forged-norun": "unknown_run",
    }
    entries = wait_for(lambda: len(e := _entries(stack)) == 5 and e, 60, "five dead letters")
    assert {e["id"].rpartition("-")[0] if "refused" in e["id"] else e["id"]: e["reason"]
            for e in entries} == expected  # fmt: skip
    # A message that never decoded cannot be redriven; a refused batch keeps every key
    # and can be, once its cause is fixed.
    redrivable = {e["reason"] for e in entries if e["redrivable"]}
    assert redrivable == {"unknown_target", "out_of_scope", "unknown_run"}
    scope_entry = next(e for e in entries if e["reason"] == "out_of_scope")
    assert [k["key"] for k in scope_entry["keys"]] == [KEYS[0], "receipts/keep-me.json"]
    assert proxy.delete_requests == 0
    assert "receipts/keep-me.json" in list_keys(s3, bucket)
    assert KEYS[0] in list_keys(s3, bucket)

    # And the same worker process still runs a real cleanup afterwards
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["status"] == "complete"
    assert run["deleted"] == 300
    assert worker.alive()


def test_a_batch_whose_worker_dies_on_every_delivery_is_dead_lettered_as_worker_lost(make_stack):
    # Given a target whose deletes kill the worker's pool process every time
    stack = make_stack(
        '[targets.doomed]\nkind = "tests.kinds:KillerKind"\nretention_days = 1\n'
        'schedule = "0 3 * * 0"\n',
        env={"CLEANUP_MAX_DELIVERIES": "3"},
    )
    worker = stack.worker(concurrency=1)

    # When its run is started
    result = stack.cli("run", "doomed", "--wait", "--json", "--timeout", "120")

    # Then after 3 deliveries the batch goes to the dead-letter queue as worker_lost
    run = result.json()
    assert run["status"] == "complete_with_failures", result
    assert run["dead_lettered"] == 3
    assert run["duplicates"] == 3  # deliveries 2, 3 and 4
    (entry,) = _entries(stack)
    assert entry["reason"] == "worker_lost"
    assert {k["code"] for k in entry["keys"]} == {"worker_lost"}
    assert worker.alive()  # the pool replaced its children; the worker itself kept going


def test_a_batch_whose_checks_raise_on_every_delivery_is_dead_lettered_after_the_cap(make_stack):
    # Given a target whose every batch raises before anything is deleted (a dropped table)
    stack = make_stack(
        '[targets.broken]\nkind = "tests.kinds:BrokenKind"\nretention_days = 0\n'
        'schedule = "0 3 * * 0"\n',
        env={"CLEANUP_MAX_DELIVERIES": "3"},
    )
    worker = stack.worker(concurrency=1)

    # When its run is started
    result = stack.cli("run", "broken", "--wait", "--json", "--timeout", "120")

    # Then after 3 deliveries, with backoff between them, the batch is dead-lettered whole
    run = result.json()
    assert run["status"] == "complete_with_failures", result
    assert run["dead_lettered"] == 3
    (entry,) = _entries(stack)
    assert entry["reason"] == "worker_error"
    assert "3 deliveries failed" in entry["message"]
    assert 'relation "snapshots" does not exist' in entry["message"]
    assert sorted(k["key"] for k in entry["keys"]) == ["doomed/0", "doomed/1", "doomed/2"]
    assert entry["redrivable"]
    assert worker.output().count("Retry in") == 2
    assert worker.alive()


def test_run_report_is_written_to_the_audit_location_and_adds_up(make_stack, s3, bucket, proxy):
    # Given an audit location and a run where 3 keys are denied
    s3.create_bucket(Bucket=f"{bucket}-audit")
    cutoff = seed_split(s3, bucket, KEYS[:900], KEYS[900:950])
    proxy.deny_keys = {KEYS[1], KEYS[2], KEYS[3]}
    stack = make_stack(
        s3_targets(bucket), env={"CLEANUP_AUDIT_URL": f"s3://{bucket}-audit/reports/"}
    )
    stack.worker()

    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()

    # Then the report exists where status says, and its numbers add up
    # (a folder of its own per end of the run: its end time, then its token)
    prefix = run["report_url"].removeprefix(f"s3://{bucket}-audit/")
    folder = re.escape(f"reports/statements/{run['run_id']}/")
    assert re.fullmatch(folder + r"[0-9]{8}T[0-9]{9}Z-[0-9a-f]{12}/", prefix), prefix
    summary = json.loads(
        s3.get_object(Bucket=f"{bucket}-audit", Key=prefix + "summary.json")["Body"].read()
    )
    assert summary["expired"] == 900
    assert summary["deleted"] + summary["dead_lettered"] + summary["skipped"] == summary["expired"]
    assert summary["accounting"]["balanced"] is True
    assert summary["config_digest"] == run["config_digest"]
    rows = s3.get_object(Bucket=f"{bucket}-audit", Key=prefix + "not_deleted.jsonl")["Body"].read()
    lines = [json.loads(line) for line in rows.decode().splitlines()]
    assert {(r["key"], r["code"]) for r in lines} == {(k, "AccessDenied") for k in KEYS[1:4]}


def test_a_report_that_cannot_be_written_stays_pending_and_is_written_later(
    make_stack, s3, bucket, proxy
):
    # Given a run whose audit location refuses writes (a role missing s3:PutObject there)
    s3.create_bucket(Bucket=f"{bucket}-audit")
    cutoff = seed_split(s3, bucket, KEYS[:600], [])
    proxy.deny_puts_under = f"/{bucket}-audit/"
    stack = make_stack(
        s3_targets(bucket), env={"CLEANUP_AUDIT_URL": f"s3://{bucket}-audit/reports/"}
    )
    stack.worker()

    # When the run ends
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()

    # Then it keeps its final state, and its status says the report is pending, and why
    assert (run["status"], run["deleted"]) == ("complete", 600)
    assert run["report_pending"] is True
    assert "AccessDenied" in run["report_error"]
    assert proxy.faults_injected["put_denied"] >= 1

    # When the cause is fixed and the report is asked for again
    proxy.deny_puts_under = ""
    written = stack.cli("report", run["run_id"], "--json")

    # Then it is written, and nothing was counted again
    assert written.code == 0, written
    after = written.json()
    assert after["report_pending"] is False
    assert "report_error" not in after
    for counter in ("expired", "deleted", "skipped", "dead_lettered", "batches_done"):
        assert after[counter] == run[counter], counter
    prefix = after["report_url"].removeprefix(f"s3://{bucket}-audit/")
    assert prefix.startswith(f"reports/statements/{run['run_id']}/")
    summary = json.loads(
        s3.get_object(Bucket=f"{bucket}-audit", Key=prefix + "summary.json")["Body"].read()
    )
    assert (summary["status"], summary["deleted"]) == ("complete", 600)


def test_purge_leaves_an_audit_record(make_stack, s3, bucket, proxy):
    cutoff = seed_split(s3, bucket, KEYS[:10], [])
    proxy.deny_keys = {KEYS[4]}
    s3.create_bucket(Bucket=f"{bucket}-audit")
    stack = make_stack(s3_targets(bucket), env={"CLEANUP_AUDIT_URL": f"s3://{bucket}-audit/"})
    stack.worker()
    stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait")
    (entry,) = _entries(stack)

    refused = stack.cli("dlq", "purge", entry["id"])
    assert refused.code == 2
    assert "--yes" in refused.stderr
    purged = stack.cli("dlq", "purge", entry["id"], "--yes", "--json")

    assert purged.code == 0, purged
    record = purged.json()["audit_records"][0]
    assert record["entry"]["keys"][0]["key"] == KEYS[4]
    assert record["command"].startswith("digest-cleanup dlq purge")
    assert _entries(stack) == []
    runtime = Runtime(Settings.from_env(stack.env))
    assert runtime.dead_letters.audit_log()[0]["entry"]["id"] == entry["id"]
    # and the record is kept for good at the audit location, too
    key = purged.json()["audit_url"].removeprefix(f"s3://{bucket}-audit/")
    kept = json.loads(s3.get_object(Bucket=f"{bucket}-audit", Key=key)["Body"].read())
    assert [r["entry"]["id"] for r in kept] == [entry["id"]]
