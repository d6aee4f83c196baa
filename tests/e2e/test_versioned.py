"""Versioned buckets with Object Lock on the real S3 server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import put_keys, s3_targets, seed_split
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.s3_messages import (
    access_denied_entries,
    delete_result,
    fix_integrity_headers,
    is_delete_objects,
    merge_errors,
    split_delete_body,
)
from tests.rig.stack import wait_for

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


def _deleted_statements(s3: Any, bucket: str, keys: list[str], versions: int = 2) -> None:
    """Write ``versions`` data versions of each key, then delete it: a delete marker on top."""
    for n in range(versions):
        put_keys(s3, bucket, keys, body=f"version {n}".encode())
    for key in keys:
        s3.delete_object(Bucket=bucket, Key=key)


def _hold_oldest(s3: Any, bucket: str, keys: list[str]) -> dict[str, str]:
    """Put the oldest data version of each key under legal hold; key -> its versioned key."""
    held = {}
    for key in keys:
        oldest = [v for v, marker in _versions(s3, bucket)[key] if not marker][-1]
        s3.put_object_legal_hold(
            Bucket=bucket, Key=key, VersionId=oldest, LegalHold={"Status": "ON"}
        )
        held[key] = f"{key}?versionId={oldest}"
    return held


def _readable(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("404", "NoSuchKey"):
            raise
        return False
    return True


def _dead_letters(stack: Any) -> list[dict[str, Any]]:
    return list(stack.cli("dlq", "list", "--json").json()["entries"])


def test_deleted_statements_with_a_held_old_version_stay_deleted(make_stack, s3, locked_bucket):
    # Given 20 deleted statements (two versions and a delete marker each), the
    # oldest version of 5 of them under legal hold
    bucket = locked_bucket
    keys = OLD[:20]
    _deleted_statements(s3, bucket, keys)
    held = _hold_oldest(s3, bucket, keys[::4])
    markers = {k: [f"{k}?versionId={v}" for v, m in _versions(s3, bucket)[k] if m] for k in held}
    cutoff = seed_split(s3, bucket, [], NEW)
    s3.create_bucket(Bucket=f"{bucket}-audit")
    audit = {"CLEANUP_AUDIT_URL": f"s3://{bucket}-audit/reports/"}
    stack = make_stack(s3_targets(bucket, versions="all"), env=audit)
    stack.worker()

    # When the run is waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then no deleted statement reads again: the held ones keep their delete markers
    assert [k for k in keys if _readable(s3, bucket, k)] == []
    left = _versions(s3, bucket)
    assert {k for k in keys if k in left} == set(held)
    assert all(sorted(m for _, m in left[k]) == [False, True] for k in held)
    # and the run counts every version, with the held ones and their markers dead-lettered
    run = result.json()
    assert result.code == 1, result
    assert (run["expired"], run["deleted"], run["dead_lettered"], run["skipped"]) == (
        60,
        50,
        10,
        0,
    )
    # and the dead letters name each held version as locked, and its marker as kept for it
    codes = {k["key"]: (k["code"], k["message"]) for e in _dead_letters(stack) for k in e["keys"]}
    assert {k: c for k, (c, _) in codes.items()} == {
        **dict.fromkeys(held.values(), "locked"),
        **{marker: "marker_kept" for k in held for marker in markers[k]},
    }
    assert all(held[k] in codes[m][1] for k in held for m in markers[k])
    # and so does the run's audit report
    report = run["report_url"].removeprefix(f"s3://{bucket}-audit/") + "not_deleted.jsonl"
    rows = s3.get_object(Bucket=f"{bucket}-audit", Key=report)["Body"].read().decode()
    assert {(r["key"], r["code"]) for r in map(json.loads, rows.splitlines())} == {
        (k, c) for k, (c, _) in codes.items()
    }
    # and verify still finds them, unreadable
    verify = stack.cli("verify", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert verify.json()["remaining_expired"] == 10


def test_a_key_at_a_batch_boundary_keeps_its_versions_in_one_batch(make_stack, s3, locked_bucket):
    # Given deleted statements of one version and a delete marker each, batches of 3
    # (so a cut every 3 keys would part the second key from its marker), and the
    # version of every second key under legal hold
    bucket = locked_bucket
    keys = OLD[:8]
    _deleted_statements(s3, bucket, keys, versions=1)
    held = _hold_oldest(s3, bucket, keys[1::2])
    cutoff = seed_split(s3, bucket, [], [])
    stack = make_stack(s3_targets(bucket, versions="all", batch_size=3))
    stack.worker(concurrency=4)

    # When the run is waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then no held statement reads again
    assert result.code == 1, result
    assert [k for k in keys if _readable(s3, bucket, k)] == []
    # and each held version is dead-lettered in one entry (one batch) with its marker
    entries = _dead_letters(stack)
    assert len(entries) == len(held)
    for entry in entries:
        (version,) = [k["key"] for k in entry["keys"] if k["code"] == "locked"]
        base = version.partition("?versionId=")[0]
        assert held[base] == version
        assert [k["code"] for k in entry["keys"]] == ["locked", "marker_kept"]
        assert all(k["key"].startswith(base + "?versionId=") for k in entry["keys"])
    # and every batch held whole keys only: 8 keys of 2 entries in batches of 3 is 8 batches
    assert result.json()["batches"] == len(keys)


class DenyOneVersion(ReverseProxy):
    """Refuses the first version of each of ``keys`` that a DeleteObjects names.

    As a bucket policy that denies deleting one version would: that version comes
    back as a per-key AccessDenied, and the rest of the request is deleted.  The
    FaultProxy's ``deny_keys`` refuses every version of a key, markers included,
    which cannot part a key's versions from its marker.
    """

    label = "version-denying proxy"

    def __init__(self, upstream_url: str, keys: set[str]) -> None:
        super().__init__(upstream_url)
        self.keys = frozenset(keys)

    def handle(self, request: ProxyHandler) -> None:
        body = request.read_body()
        if body is None or not is_delete_objects(request.command, request.path):
            request.relay(body)
            return
        seen: set[str] = set()

        def refuse(key: str) -> bool:
            first = key in self.keys and key not in seen
            seen.add(key)
            return first

        parsed = split_delete_body(body, refuse)
        if parsed is None or not parsed.denied:
            request.relay(body)
            return
        injected = access_denied_entries(parsed.denied)
        if not parsed.forwarded_keys:
            request.reply(200, delete_result(injected), [])
            return
        headers = fix_integrity_headers(request.forward_headers(parsed.body), parsed.body)
        response = request.exchange(headers, parsed.body)
        if response is not None and response.status == 200:
            response = response._replace(body=merge_errors(response.body, injected))
        if response is not None:
            request.send(*response)


def test_a_version_whose_delete_is_refused_keeps_its_keys_marker(
    make_stack, s3, weed, locked_bucket
):
    # Given 6 deleted statements (two versions and a marker each), and a store that
    # refuses to delete one version of 3 of them
    bucket = locked_bucket
    keys = OLD[:6]
    _deleted_statements(s3, bucket, keys)
    refused = set(keys[::2])
    cutoff = seed_split(s3, bucket, [], [])
    with DenyOneVersion(weed.endpoint_url, refused) as proxy:
        stack = make_stack(s3_targets(bucket, versions="all"), direct_s3=proxy.endpoint_url)
        stack.worker()

        # When the run is waited for
        result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

        # Then no statement reads again: the refused ones keep a version and their marker
        assert [k for k in keys if _readable(s3, bucket, k)] == []
        left = _versions(s3, bucket)
        assert set(left) == refused
        assert all(sorted(m for _, m in left[k]) == [False, True] for k in refused)
        # and the dead letters name the refused version, and the marker kept for it
        assert result.code == 1, result
        (entry,) = _dead_letters(stack)
        codes = sorted((k["key"].partition("?")[0], k["code"]) for k in entry["keys"])
        assert codes == sorted(
            [(k, "AccessDenied") for k in refused] + [(k, "marker_kept") for k in refused]
        )
        stack.stop()


def test_a_held_version_and_its_kept_marker_are_redriven_together_once_the_hold_is_lifted(
    make_stack, s3, locked_bucket
):
    # Given a run that kept 2 held versions, each with its key's delete marker
    bucket = locked_bucket
    keys = OLD[:4]
    _deleted_statements(s3, bucket, keys)
    held = _hold_oldest(s3, bucket, keys[:2])
    cutoff = seed_split(s3, bucket, [], [])
    stack = make_stack(s3_targets(bucket, versions="all"))
    stack.worker()
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    assert run.json()["dead_lettered"] == 4, run

    # When the holds are lifted and the dead letters redriven
    for key, version in held.items():
        s3.put_object_legal_hold(
            Bucket=bucket,
            Key=key,
            VersionId=version.partition("?versionId=")[2],
            LegalHold={"Status": "OFF"},
        )
    redriven = stack.cli("dlq", "redrive", "--all", "--json")
    assert redriven.code == 0, redriven

    # Then each version goes, and its marker after it: nothing of the keys is left
    wait_for(lambda: not set(_versions(s3, bucket)) & set(keys), 60, "the redriven versions")
    assert [k for k in keys if _readable(s3, bucket, k)] == []
    assert _dead_letters(stack) == []
