"""``versions = "all"`` deletes on a real S3 server: a key's delete markers go last.

Deleting a delete marker makes the newest remaining data version current again,
so each test ends by asking the store whether a deleted statement reads again.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from digest_cleanup.errors import PermanentError
from digest_cleanup.kinds import CHANGED_SINCE_LISTING, Outcome
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.settings import Settings
from tests.conftest import put_keys, seed_split

LATER = datetime.now(UTC) + timedelta(days=1)
#: The code of a delete marker kept because a data version of its key stayed.
MARKER_KEPT = "marker_kept"


@pytest.fixture
def locked_bucket(s3: Any) -> str:
    name = f"versions-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return name


def _kind(weed: Any, bucket: str) -> S3Kind:
    settings = Settings(
        s3_endpoint_url=weed.endpoint_url, aws_access_key_id="k", aws_secret_access_key="s"
    )
    options = S3Options(bucket=bucket, prefix="statements/", versions="all")
    return S3Kind("statements", options, settings)


def _deleted_statements(s3: Any, bucket: str, keys: list[str]) -> dict[str, list[str]]:
    """Write two versions of each key, then delete it (a marker on top); key -> data versions."""
    put_keys(s3, bucket, keys, body=b"first")
    put_keys(s3, bucket, keys, body=b"second")
    for key in keys:
        s3.delete_object(Bucket=bucket, Key=key)
    listing = s3.list_object_versions(Bucket=bucket, Prefix="statements/")
    versions: dict[str, list[str]] = {key: [] for key in keys}
    for version in listing.get("Versions", []):
        versions[version["Key"]].append(version["VersionId"])
    return versions


def _listed(kind: S3Kind, cutoff: datetime = LATER) -> list[str]:
    return [key for page in kind.scan(cutoff) for key in page.expired]


def _readable(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("404", "NoSuchKey"):
            raise
        return False
    return True


def _left(s3: Any, bucket: str) -> set[str]:
    listing = s3.list_object_versions(Bucket=bucket, Prefix="statements/")
    entries = [*listing.get("Versions", []), *listing.get("DeleteMarkers", [])]
    return {f"{e['Key']}?versionId={e['VersionId']}" for e in entries}


def test_a_held_version_keeps_its_keys_delete_marker_and_the_key_stays_unreadable(
    weed, s3, locked_bucket
):
    # Given two deleted statements, the oldest version of one under legal hold
    held, free = "statements/held.pdf", "statements/free.pdf"
    versions = _deleted_statements(s3, locked_bucket, [held, free])
    oldest = versions[held][-1]
    s3.put_object_legal_hold(
        Bucket=locked_bucket, Key=held, VersionId=oldest, LegalHold={"Status": "ON"}
    )
    kind = _kind(weed, locked_bucket)
    keys = _listed(kind)

    # When their versions are deleted, as one batch
    results = {r.key: r for r in kind.delete(keys, LATER)}

    # Then the held key keeps its version and its marker, and still reads as deleted
    assert not _readable(s3, locked_bucket, held)
    held_version = f"{held}?versionId={oldest}"
    (marker,) = [k for k in _left(s3, locked_bucket) if k != held_version]
    assert _left(s3, locked_bucket) == {held_version, marker}
    assert (results[held_version].outcome, results[held_version].code) == (
        Outcome.PERMANENT,
        "locked",
    )
    # and the marker is dead-lettered beside it, naming the version that stayed
    assert (results[marker].outcome, results[marker].code) == (Outcome.PERMANENT, MARKER_KEPT)
    assert held_version in results[marker].message
    # and every other version, the free key's marker included, is deleted
    assert {k for k, r in results.items() if r.outcome is Outcome.DELETED} == set(keys) - {
        held_version,
        marker,
    }


def test_a_key_whose_only_entries_are_delete_markers_loses_them(weed, s3, locked_bucket):
    # Given a deleted statement whose data versions are already gone: only its marker is left
    key = "statements/only-marker.pdf"
    versions = _deleted_statements(s3, locked_bucket, [key])
    for version in versions[key]:
        s3.delete_object(Bucket=locked_bucket, Key=key, VersionId=version)
    kind = _kind(weed, locked_bucket)
    keys = _listed(kind)
    assert len(keys) == 1

    # When it is deleted
    results = kind.delete(keys, LATER)

    # Then the marker goes too: nothing is left to come back
    assert [r.outcome for r in results] == [Outcome.DELETED]
    assert _left(s3, locked_bucket) == set()


def test_markers_in_a_batch_without_their_keys_data_versions_are_kept_and_retried(
    weed, s3, locked_bucket
):
    # Given a deleted statement split over two batches: its marker in one, its data in another
    key = "statements/split.pdf"
    versions = _deleted_statements(s3, locked_bucket, [key])
    kind = _kind(weed, locked_bucket)
    keys = _listed(kind)
    data = [f"{key}?versionId={v}" for v in versions[key]]
    markers = [k for k in keys if k not in data]

    # When the markers' batch runs first
    results = kind.delete(markers, LATER)

    # Then the markers are kept and retried, and the statement does not read again
    assert [(r.outcome, r.code) for r in results] == [(Outcome.TRANSIENT, MARKER_KEPT)]
    assert data[0] in results[0].message
    assert not _readable(s3, locked_bucket, key)
    # and once the data versions' batch ran, the retried markers go
    assert [r.outcome for r in kind.delete(data, LATER)] == [Outcome.DELETED] * 2
    assert [r.outcome for r in kind.delete(markers, LATER)] == [Outcome.DELETED]
    assert _left(s3, locked_bucket) == set()


def test_a_key_written_again_after_its_listing_keeps_its_markers(weed, s3, locked_bucket):
    # Given a deleted statement, listed, then written again after the cutoff
    key = "statements/reissued.pdf"
    versions = _deleted_statements(s3, locked_bucket, [key])
    kind = _kind(weed, locked_bucket)
    cutoff = seed_split(s3, locked_bucket, [], [])
    keys = _listed(kind, cutoff)
    s3.put_object(Bucket=locked_bucket, Key=key, Body=b"reissued")

    # When the listed versions are deleted
    results = {r.key: r for r in kind.delete(keys, cutoff)}

    # Then the old data versions go by id, but the markers stay: the key lives again
    old = {f"{key}?versionId={v}" for v in versions[key]}
    assert {k for k, r in results.items() if r.outcome is Outcome.DELETED} == old
    (marker,) = set(keys) - old
    assert (results[marker].outcome, results[marker].code) == (
        Outcome.SKIPPED,
        CHANGED_SINCE_LISTING,
    )
    assert s3.get_object(Bucket=locked_bucket, Key=key)["Body"].read() == b"reissued"
    assert marker in _left(s3, locked_bucket)


def test_a_versions_listing_that_replaced_a_character_fails_instead_of_deleting_nothing(
    weed, s3, locked_bucket
):
    # Given a statement whose key has a control character, which this server's
    # ListObjectVersions writes as U+FFFD (it ignores encoding-type=url there)
    key = "statements/odd\x01name.pdf"
    s3.put_object(Bucket=locked_bucket, Key=key, Body=b"statement")

    # When the target is listed by version
    with pytest.raises(PermanentError) as raised:
        _listed(_kind(weed, locked_bucket))

    # Then the listing fails, naming the key, instead of expiring a name that a
    # delete would answer "deleted" for while the statement stays
    assert raised.value.code == "listing_not_encoded"
    assert "odd\ufffdname" in raised.value.message
    assert _readable(s3, locked_bucket, key)
