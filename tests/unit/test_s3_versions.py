"""The versioned delete path against a scripted S3 client: its requests, order and outcomes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from digest_cleanup.kinds import Outcome
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.kinds.s3_versions import MARKER_KEPT
from digest_cleanup.settings import Settings

OLD = datetime(2026, 10, 18, tzinfo=UTC)
CUTOFF = OLD + timedelta(days=30)


class ScriptedClient:
    """Answers list_object_versions from ``pages`` and delete_objects from ``delete``."""

    def __init__(self, pages: list[Any], errors: dict[str, str] | None = None) -> None:
        self.pages = pages
        #: "key?versionId=v" -> the per-key error code DeleteObjects answers for it.
        self.errors = errors or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_object_versions(self, **params: Any) -> dict[str, Any]:
        self.calls.append(("list", params))
        if isinstance(self.pages[0], Exception):
            raise self.pages[0]
        return self.pages.pop(0)

    def delete_objects(self, **params: Any) -> dict[str, Any]:
        self.calls.append(("delete", params))
        deleted, errors = [], []
        for obj in params["Delete"]["Objects"]:
            code = self.errors.get(f"{obj['Key']}?versionId={obj['VersionId']}")
            (errors if code else deleted).append({**obj, **({"Code": code} if code else {})})
        return {"Deleted": deleted, "Errors": errors}

    def deletes(self) -> list[list[str]]:
        return [
            [f"{o['Key']}?versionId={o['VersionId']}" for o in params["Delete"]["Objects"]]
            for name, params in self.calls
            if name == "delete"
        ]


def _kind(client: ScriptedClient) -> S3Kind:
    settings = Settings(aws_access_key_id="k", aws_secret_access_key="s")
    kind = S3Kind("statements", S3Options(bucket="b", prefix="s/", versions="all"), settings)
    kind._client = client
    return kind


def _page(*entries: tuple[str, str, bool], **extra: Any) -> dict[str, Any]:
    """A ListObjectVersions page of (key, version id, is delete marker) entries."""
    versions = [{"Key": k, "VersionId": v, "LastModified": OLD} for k, v, m in entries if not m]
    markers = [{"Key": k, "VersionId": v, "LastModified": OLD} for k, v, m in entries if m]
    return {"Versions": versions, "DeleteMarkers": markers, **extra}


def test_data_versions_go_in_one_request_and_the_markers_in_a_second() -> None:
    # Given two deleted keys, their versions in the batch's order markers first
    client = ScriptedClient([_page(("s/a", "1", False), ("s/a", "m", True), ("s/b", "2", False))])
    keys = ["s/a?versionId=m", "s/a?versionId=1", "s/b?versionId=2"]

    # When the batch is deleted
    results = _kind(client).delete(keys, CUTOFF)

    # Then the store's listing says which is the marker, and it goes after the data
    assert [r.outcome for r in results] == [Outcome.DELETED] * 3
    assert client.deletes() == [["s/a?versionId=1", "s/b?versionId=2"], ["s/a?versionId=m"]]


def test_the_listing_spans_the_batch_from_just_before_its_first_key_to_past_its_last() -> None:
    # Given a range listed over two pages, and a third the batch does not reach
    more = {"IsTruncated": True, "NextKeyMarker": "s/k2", "NextVersionIdMarker": "x"}
    past = {"IsTruncated": True, "NextKeyMarker": "s/k9"}
    client = ScriptedClient(
        [
            _page(("s/k1", "1", False), ("s/k2", "2", False), **more),
            _page(("s/k2", "m", True), ("s/k3", "3", False), **past),
            _page(("s/k9", "boom", False)),
        ]
    )

    _kind(client).delete(["s/k1?versionId=1", "s/k2?versionId=2", "s/k2?versionId=m"], CUTOFF)

    lists = [params for name, params in client.calls if name == "list"]
    assert lists == [
        {"Bucket": "b", "Prefix": "s/k", "KeyMarker": "s/k"},
        {"Bucket": "b", "Prefix": "s/k", "KeyMarker": "s/k2", "VersionIdMarker": "x"},
    ]
    assert client.deletes()[-1] == ["s/k2?versionId=m"]


def test_a_version_that_fails_transiently_keeps_its_marker_for_the_retry() -> None:
    # Given a key whose data version is throttled
    client = ScriptedClient(
        [_page(("s/a", "1", False), ("s/a", "m", True))], errors={"s/a?versionId=1": "SlowDown"}
    )

    results = _kind(client).delete(["s/a?versionId=1", "s/a?versionId=m"], CUTOFF)

    # Then both are retried together, the marker saying which version it waits for
    assert [(r.outcome, r.code) for r in results] == [
        (Outcome.TRANSIENT, "SlowDown"),
        (Outcome.TRANSIENT, MARKER_KEPT),
    ]
    assert "s/a?versionId=1" in results[1].message
    assert client.deletes() == [["s/a?versionId=1"]]


def test_a_batch_whose_listing_fails_deletes_nothing() -> None:
    # Given a listing that is throttled
    throttled = ClientError(
        {"Error": {"Code": "SlowDown", "Message": "slow"}}, "ListObjectVersions"
    )
    client = ScriptedClient([throttled])

    results = _kind(client).delete(["s/a?versionId=1", "s/a?versionId=m"], CUTOFF)

    # Then without the store's word nothing is sent, and the whole batch is retried
    assert [(r.outcome, r.code) for r in results] == [(Outcome.TRANSIENT, "SlowDown")] * 2
    assert client.deletes() == []


def test_a_version_the_store_no_longer_holds_counts_as_deleted() -> None:
    # Given a batch whose data version is gone already, leaving only the marker
    client = ScriptedClient([_page(("s/a", "m", True))])

    results = _kind(client).delete(["s/a?versionId=1", "s/a?versionId=m"], CUTOFF)

    # Then the version is sent anyway (idempotent), and the marker follows
    assert [r.outcome for r in results] == [Outcome.DELETED] * 2
    assert client.deletes() == [["s/a?versionId=1"], ["s/a?versionId=m"]]


def test_a_listing_truncated_without_a_marker_to_go_on_deletes_nothing() -> None:
    # Given a listing page that says there is more but not where it goes on
    client = ScriptedClient([_page(("s/a", "1", False), IsTruncated=True)])

    results = _kind(client).delete(["s/a?versionId=1", "s/a?versionId=m"], CUTOFF)

    # Then the unlisted rest might hold the marker: nothing is sent, and all is retried
    assert [(r.outcome, r.code) for r in results] == [(Outcome.TRANSIENT, "listing_truncated")] * 2
    assert client.deletes() == []
