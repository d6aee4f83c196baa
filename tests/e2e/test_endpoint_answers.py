"""Answers an endpoint can give that must not pass for success, on the real stack.

A 404 without an S3 error code does not make a key gone, and a ``PreconditionFailed``
on an object that still has its listed ETag does not make it ``changed_since_listing``:
both are dead-lettered with their own code, and the run does not end ``complete``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import list_keys, s3_targets, seed_split
from tests.rig.stack import Stack

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(100)]
#: A key XML 1.0 cannot carry: it goes alone in a DeleteObject, its key in the URL.
ODD = "statements/2026-10-18/ctrl\x01char.pdf"


def _entries(stack: Stack) -> list[dict[str, Any]]:
    result = stack.cli("dlq", "list", "--json")
    assert result.code == 0, result
    return list(result.json()["entries"])


def _dead_keys(stack: Stack) -> dict[str, dict[str, Any]]:
    return {k["key"]: k for e in _entries(stack) for k in e["keys"]}


def test_precondition_failed_on_unchanged_objects_is_dead_lettered_not_skipped(
    make_stack, s3, bucket, proxy
):
    # Given 100 expired keys, and an endpoint that refuses 10 of them with a per-key
    # PreconditionFailed in DeleteObjects' 200 answer although nobody touched them
    refused = KEYS[::10]
    cutoff = seed_split(s3, bucket, KEYS, [])
    proxy.precondition_failed_keys = frozenset(refused)
    stack = make_stack(s3_targets(bucket))
    stack.worker()

    # When the run deletes them
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    run = result.json()

    # Then the run is not complete: the 10 are dead-lettered as condition_mismatch, not
    # skipped, after one attempt each (retrying cannot help), and all of them still exist
    assert run["status"] == "complete_with_failures", run
    assert result.code == 1
    assert (run["deleted"], run["dead_lettered"], run["skipped"]) == (90, 10, 0)
    dead = _dead_keys(stack)
    assert {key: k["code"] for key, k in dead.items()} == dict.fromkeys(
        refused, "condition_mismatch"
    )
    assert "conditional_deletes = false" in dead[refused[0]]["message"]
    assert proxy.faults_injected["precondition_failed"] == 10
    assert list_keys(s3, bucket) == set(refused)


def test_a_bare_404_counts_no_key_deleted(make_stack, s3, bucket, proxy):
    # Given expired keys, 5 of which a misrouting gateway answers without reaching S3:
    # PreconditionFailed to the delete, then a 404 with no S3 error code to HEAD and GET;
    # and one key XML cannot carry, whose DeleteObject gets the same bare 404
    looked_up = KEYS[:5]
    keys = [*KEYS[:50], ODD]
    cutoff = seed_split(s3, bucket, keys, [])
    proxy.precondition_failed_keys = frozenset(looked_up)
    proxy.not_found_keys = frozenset([*looked_up, ODD])
    stack = make_stack(s3_targets(bucket))
    stack.worker()

    # When the run deletes them
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()

    # Then none of the six is counted deleted: each is dead-lettered as
    # not_found_unconfirmed with a message naming the endpoint setting, and each still exists
    assert run["status"] == "complete_with_failures", run
    assert (run["deleted"], run["dead_lettered"], run["skipped"]) == (45, 6, 0)
    dead = _dead_keys(stack)
    assert {key: k["code"] for key, k in dead.items()} == dict.fromkeys(
        [*looked_up, ODD], "not_found_unconfirmed"
    )
    assert all("CLEANUP_S3_ENDPOINT_URL" in k["message"] for k in dead.values())
    assert list_keys(s3, bucket) == {*looked_up, ODD}
