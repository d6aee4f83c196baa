"""Versioned buckets with Object Lock on the real S3 server."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import put_keys, s3_targets, seed_split

pytestmark = pytest.mark.e2e

OLD = [f"statements/2026-10-18/cust-{i:04d}.pdf" for i in range(40)]
NEW = [f"statements/2026-11-22/cust-{i:04d}.pdf" for i in range(10)]


def _versions(s3: Any, bucket: str) -> dict[str, list[tuple[str, bool]]]:
    """key -> [(version id, is delete marker)] for everything in the bucket."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for v in page.get("Versions", []):
            out.setdefault(v["Key"], []).append((v["VersionId"], False))
        for m in page.get("DeleteMarkers", []):
            out.setdefault(m["Key"], []).append((m["VersionId"], True))
    return out


@pytest.fixture
def locked_bucket(s3: Any, bucket: str) -> str:
    name = bucket + "-lock"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return name


def test_all_versions_of_expired_keys_go_and_a_legal_hold_is_reported_locked(
    make_stack, s3, locked_bucket
):
    # Given expired keys with two versions each, some under a delete marker,
    # one old version under legal hold, and fresh keys plus one old key rewritten later
    bucket = locked_bucket
    put_keys(s3, bucket, OLD)
    put_keys(s3, bucket, OLD, body=b"second version")
    for key in OLD[:5]:
        s3.delete_object(Bucket=bucket, Key=key)  # a delete marker on top
    held_key = OLD[10]
    held_version = _versions(s3, bucket)[held_key][-1][0]
    s3.put_object_legal_hold(
        Bucket=bucket, Key=held_key, VersionId=held_version, LegalHold={"Status": "ON"}
    )
    cutoff = seed_split(s3, bucket, [], NEW)
    put_keys(s3, bucket, [OLD[20]], body=b"rewritten after the cutoff")
    stack = make_stack(s3_targets(bucket, versions="all"))
    stack.worker()

    # When the run is waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then every version and delete marker of the expired keys is gone but the held one
    run = result.json()
    assert result.code == 1, result
    assert run["dead_lettered"] == 1
    left = _versions(s3, bucket)
    expired_left = {k: v for k, v in left.items() if k in OLD and k != OLD[20]}
    assert expired_left == {held_key: [(held_version, False)]}
    # and fresh keys, and the rewritten key with all its history, are untouched
    assert len(left[OLD[20]]) == 3
    assert all(len(left[k]) == 1 for k in NEW)
    # and the held version is reported as locked
    (entry,) = stack.cli("dlq", "list", "--json").json()["entries"]
    assert [(k["key"], k["code"]) for k in entry["keys"]] == [
        (f"{held_key}?versionId={held_version}", "locked")
    ]
    verify = stack.cli("verify", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert verify.json()["remaining_expired"] == 1
    assert verify.code == 1


def test_without_all_versions_a_versioned_bucket_only_gains_delete_markers(
    make_stack, s3, locked_bucket
):
    # Given a versioned bucket and a target that deletes current versions only
    bucket = locked_bucket
    cutoff = seed_split(s3, bucket, OLD[:20], [])
    stack = make_stack(s3_targets(bucket))
    stack.worker()

    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()

    # Then the keys look deleted, but their data survives as noncurrent versions, and verify says so
    assert run["deleted"] == 20
    versions = _versions(s3, bucket)
    assert all(sorted(m for _, m in versions[k]) == [False, True] for k in OLD[:20])
    verify = stack.cli("verify", "statements", "--cutoff", cutoff.isoformat(), "--json").json()
    assert verify["remaining_expired"] == 0
    assert verify["noncurrent_versions"] == 40  # 20 noncurrent versions and 20 delete markers
