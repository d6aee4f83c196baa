"""A batch message carries no authority: the run store says what a batch may delete.

Real worker processes against a real Redis and a real S3 (``weed mini`` behind the
fault proxy).  Each test forges, replays or mis-delivers batches the way someone with
write access to the broker, or a fleet with a stale targets file, would.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
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
from tests.rig.stack import Stack, wait_for
from tests.rig.tools import require, require_tool

pytestmark = pytest.mark.e2e

EXPIRED = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(500)]
FRESH = [f"statements/2026-10-25/cust-{i:06d}.pdf" for i in range(100)]
REWRITTEN = b"%PDF-1.7 re-rendered after the listing"


def _send(stack: Stack, payload: BatchPayload) -> None:
    app = create_app(Settings.from_env(stack.env))
    app.send_task("digest_cleanup.delete_batch", kwargs=payload.to_message(), queue="batches")


def test_a_forged_batch_with_the_run_token_scope_and_star_condition_deletes_nothing(
    make_stack, s3, bucket, redis_client
):
    # Given a run whose one real batch waits in the queue, and fresh statements beside it
    cutoff = seed_split(s3, bucket, EXPIRED, FRESH)
    stack = make_stack(s3_targets(bucket))
    run_id = _sweep_only(stack, redis_client, cutoff, batches=1)
    token = redis_client.hget(f"dc:run:{run_id}", "token").decode()
    forged = BatchPayload(
        run_id=run_id,
        run_token=token,
        target="statements",
        batch_id=f"{run_id}-b00001",
        seq=1,
        cutoff=cutoff.isoformat(),
        keys=FRESH,
        conditions=["*"] * len(FRESH),
        scope=scope_of(stack, "statements"),
    )

    # When someone with write access to the broker publishes, before the real batch
    # runs: the fresh keys under the real batch's id with the condition "*", the same
    # under a made-up batch id, and the real batch's keys without their conditions
    _send(stack, forged)
    _send(stack, dataclasses.replace(forged, batch_id=f"{run_id}-b99999", seq=9))
    _send(stack, dataclasses.replace(forged, keys=EXPIRED[:10], conditions=[], attempt=3))
    stack.worker()
    run = _finished(stack, run_id)

    # Then every fresh statement is still there, the real batch deleted exactly its
    # own keys, the forgeries moved no counter, and each is dead-lettered with why
    assert list_keys(s3, bucket) == set(FRESH)
    assert (run["status"], run["deleted"], run["dead_lettered"]) == ("complete", 500, 0)
    assert int(redis_client.hget(f"dc:run:{run_id}", "inflight")) == 0
    reasons = sorted(e["reason"] for e in _entries(stack))
    assert reasons == ["batch_mismatch", "batch_mismatch", "unknown_batch"], reasons


def test_a_worker_configured_without_conditions_refuses_a_batch_listed_with_them(
    make_stack, s3, bucket, redis_client, tmp_path
):
    # Given a run listed by a fleet that sends ETag conditions, and keys rewritten since
    cutoff = seed_split(s3, bucket, EXPIRED, [])
    stack = make_stack(s3_targets(bucket))
    run_id = _sweep_only(stack, redis_client, cutoff, batches=1)
    rewritten = EXPIRED[::5]
    put_keys(s3, bucket, rewritten, body=REWRITTEN)

    # When its batch is delivered to a worker whose targets file says
    # conditional_deletes = false (a host of a mixed fleet not yet updated)
    stale = tmp_path / "stale-targets.toml"
    stale.write_text(s3_targets(bucket, conditional_deletes=False))
    stack.worker(env={"CLEANUP_TARGETS_FILE": str(stale)})
    entry = wait_for(lambda: next(iter(_entries(stack)), None), 60, "the batch to be refused")

    # Then nothing was deleted, unconditionally or at all, and the batch waits whole
    # as target_changed, to be redriven by a worker with the run's configuration
    assert entry["reason"] == "target_changed", entry
    assert list_keys(s3, bucket) == set(EXPIRED)
    assert _status(stack, run_id)["conditional_deletes"] is True


def test_abort_stops_every_delete_of_the_run_that_has_not_yet_been_sent(
    make_stack, s3, bucket, redis_client, proxy
):
    # Given a run of 40 batches that its delete budget paces at one batch a second
    keys = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(2000)]
    cutoff = seed_split(s3, bucket, keys, [])
    stack = make_stack(s3_targets(bucket, batch_size=50, delete_rate=50))
    stack.worker(concurrency=8, pool="threads")
    started = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert started.code == 0, started
    run_id = started.json()["run_id"]
    wait_for(lambda: proxy.delete_requests >= 2, 60, "the first deletes")

    # When an operator aborts it mid-run
    aborted = stack.cli("abort", run_id, "--reason", "wrong cutoff", "--yes", "--json")
    assert aborted.json()["reason"] == "aborted", aborted  # exit 3: the run is failed now
    sent_at_abort = proxy.delete_requests

    # Then no delete of that run reaches S3 afterwards (at most one already on the
    # wire), and every batch not yet sent waits as a dead letter, keys kept
    def all_refused() -> list[dict[str, Any]] | None:
        entries = _entries(stack)
        held = sum(len(e["keys"]) for e in entries)
        return entries if entries and held == len(list_keys(s3, bucket)) else None

    entries = wait_for(all_refused, 90, "every batch not yet sent to be refused")
    assert proxy.delete_requests <= sent_at_abort + 1
    assert {e["reason"] for e in entries} == {"run_ended"}
    assert len(list_keys(s3, bucket)) >= 2000 - 50 * (sent_at_abort + 1)
    assert _status(stack, run_id)["status"] == "failed"


def _faketime_library() -> str:
    require_tool("faketime")
    found = [
        p
        for p in (
            Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
            Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
            Path("/usr/lib/faketime/libfaketime.so.1"),
        )
        if p.exists()
    ]
    require(
        bool(found), "no libfaketime.so.1 beside `faketime`", install="apt-get install -y faketime"
    )
    return str(found[0])


def test_a_worker_whose_clock_is_two_days_fast_refuses_a_cutoff_inside_retention(
    make_stack, s3, bucket, redis_client, proxy
):
    # Given statements written just now, a target that keeps them a day, and a worker
    # whose clock runs two days fast (libfaketime; Redis and S3 keep the true time)
    put_keys(s3, bucket, FRESH)
    targets = (
        s3_targets(bucket)
        .replace('schedule = "0 3 * * 0"', 'schedule = "* * * * *"')
        .replace("retention_days = 0", "retention_days = 1")
    )
    stack = make_stack(targets)
    fast = {
        "LD_PRELOAD": _faketime_library(),
        "FAKETIME": "+2d",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    worker = stack.worker(env=fast)

    # When beat's trigger runs on that worker: by its own clock, every statement is
    # past the latest cutoff
    app = create_app(Settings.from_env(stack.env))
    app.send_task("digest_cleanup.trigger", kwargs={"target": "statements"}, queue="sweeps")
    wait_for(lambda: "'action': 'refused'" in worker.output(), 60, "the trigger to be refused")

    # Then the run is refused by the earliest clock (Redis's and S3's), no run is
    # opened, nothing is deleted, and the skew is counted for the target
    assert "inside the retention window" in worker.output()
    assert stack.cli("runs", "--json").json()["runs"] == []
    assert list_keys(s3, bucket) == set(FRESH)
    assert proxy.delete_requests == 0
    skew = float(redis_client.hget("dc:clock_skew", "statements").split()[0])
    assert timedelta(seconds=skew) > timedelta(days=1, hours=23), skew
