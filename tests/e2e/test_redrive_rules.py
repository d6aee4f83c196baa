"""Redrive tells the truth: what it refuses stays with every key, and a failed run stays failed."""

from __future__ import annotations

from typing import Any

import pytest

from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.conftest import list_keys, s3_targets, seed_split
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(60)]


def _entries(stack: Stack) -> list[dict[str, Any]]:
    result = stack.cli("dlq", "list", "--json")
    assert result.code == 0, result
    return list(result.json()["entries"])


def _dead_lettered_run(stack: Stack, s3: Any, bucket: str, proxy: Any) -> dict[str, Any]:
    """A finished run whose every key was denied: all 60 wait in the dead-letter queue."""
    cutoff = seed_split(s3, bucket, KEYS, [])
    proxy.deny_keys = set(KEYS)
    stack.worker()
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["dead_lettered"] == 60
    proxy.deny_keys = set()
    return dict(run)


def _keys_in_queue(stack: Stack) -> list[str]:
    return sorted(k["key"] for e in _entries(stack) for k in e["keys"])


def test_entries_of_a_renamed_target_are_refused_kept_whole_and_redriven_after_the_fix(
    make_stack, s3, bucket, proxy
):
    # Given 60 dead-lettered keys, and the target then renamed by mistake
    stack = make_stack(s3_targets(bucket))
    _dead_lettered_run(stack, s3, bucket, proxy)
    stack.targets_file.write_text(s3_targets(bucket, name="statement"))

    # When every entry is redriven
    refused = stack.cli("dlq", "redrive", "--all", "--json")

    # Then each is refused and stays where it was, with all 60 keys
    assert refused.code == 1, refused
    assert refused.json()["redriven"] == []
    assert {r["reason"] for r in refused.json()["refused"]} == {"unknown_target"}
    assert _keys_in_queue(stack) == sorted(KEYS)

    # When the mistake is fixed and they are redriven again
    stack.targets_file.write_text(s3_targets(bucket))
    redriven = stack.cli("dlq", "redrive", "--all", "--json")

    # Then every key is deleted and the queue is empty
    assert redriven.code == 0, redriven
    wait_for(lambda: not list_keys(s3, bucket), 60, "the redriven keys to be deleted")
    wait_for(lambda: not _entries(stack), 30, "the queue to empty")


def test_entries_whose_run_expired_or_restarted_or_whose_scope_changed_stay_whole(
    make_stack, s3, bucket, proxy
):
    # Given 60 dead-lettered keys in several entries
    stack = make_stack(s3_targets(bucket, batch_size=20))
    run = _dead_lettered_run(stack, s3, bucket, proxy)
    store = Runtime(Settings.from_env(stack.env)).store

    # When the scope changed, then the run restarted, then its state expired, each redrive
    # refuses every entry with the reason, and never drops a key
    stack.targets_file.write_text(
        s3_targets(bucket, batch_size=20).replace('"statements/"', '"statements/2026-10-18/"')
    )
    changed = stack.cli("dlq", "redrive", "--all", "--json").json()
    stack.targets_file.write_text(s3_targets(bucket, batch_size=20))
    store.runs.update(run["run_id"], token="a-later-incarnation")
    restarted = stack.cli("dlq", "redrive", "--all", "--json").json()
    store.reset(run["run_id"])
    expired = stack.cli("dlq", "redrive", "--all", "--json").json()

    # Then
    for result, reason in ((changed, "target_changed"), (restarted, "stale_run"),
                           (expired, "unknown_run")):  # fmt: skip
        assert result["redriven"] == [], reason
        assert {r["reason"] for r in result["refused"]} == {reason}
        assert len(result["refused"]) == 3
    assert _keys_in_queue(stack) == sorted(KEYS)
    assert list_keys(s3, bucket) == set(KEYS)


def test_redriving_the_dead_letters_of_a_failed_run_deletes_them_but_it_stays_failed(
    make_stack, s3, bucket, proxy
):
    # Given a run that failed after some of its keys were dead-lettered (its listing
    # broke off, say: what it never listed was never counted)
    stack = make_stack(s3_targets(bucket))
    run = _dead_lettered_run(stack, s3, bucket, proxy)
    store = Runtime(Settings.from_env(stack.env)).store
    store.runs.fail(run["run_id"], "listing_failed", "listing the target failed: InternalError")

    # When its dead letters are redriven
    assert stack.cli("dlq", "redrive", "--all", "--json").code == 0

    # Then their keys are deleted, but the run stays failed and says a new run is needed
    wait_for(lambda: not list_keys(s3, bucket), 60, "the redriven keys to be deleted")
    status = wait_for(
        lambda: (s := stack.cli("status", run["run_id"], "--json").json())["inflight"] == 0 and s,
        30,
        "the redriven batch to be recorded",
    )
    assert status["status"] == "failed"
    assert status["reason"] == "listing_failed"
    assert "trigger a new run" in status["message"]
    assert (status["deleted"], status["dead_lettered"]) == (60, 0)
    # and the next run for the same cutoff starts over rather than attaching
    again = stack.cli("run", "statements", "--cutoff", run["cutoff"], "--wait", "--json").json()
    assert again["action"] == "restarted"
