"""The S3 kind's conditional deletes against a real S3 server: nothing is assumed gone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.errors import PermanentError
from digest_cleanup.kinds import CHANGED_SINCE_LISTING, Outcome
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.settings import Settings
from tests.conftest import list_keys, put_keys, seed_split

LATER = datetime.now(UTC) + timedelta(days=1)


def _kind(weed: Any, bucket: str, **options: Any) -> S3Kind:
    settings = Settings(
        s3_endpoint_url=weed.endpoint_url, aws_access_key_id="k", aws_secret_access_key="s"
    )
    return S3Kind("statements", S3Options(bucket=bucket, prefix="statements/", **options), settings)


def _listed(kind: S3Kind) -> tuple[list[str], list[str]]:
    keys, conditions = [], []
    for page in kind.scan(LATER):
        keys += page.expired
        conditions += page.conditions
    return keys, conditions


def test_the_listing_gives_each_expired_key_its_etag(weed, s3, bucket):
    put_keys(s3, bucket, ["statements/a.pdf", "statements/b.pdf"], body=b"one")
    s3.put_object(Bucket=bucket, Key="statements/b.pdf", Body=b"two")

    keys, conditions = _listed(_kind(weed, bucket))

    assert keys == ["statements/a.pdf", "statements/b.pdf"]
    assert conditions == [s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys]


def test_a_key_already_gone_counts_as_deleted_and_a_rewritten_one_is_kept(weed, s3, bucket):
    # Given three listed keys: one deleted since, one rewritten since, one as listed
    keys = ["statements/gone.pdf", "statements/rewritten.pdf", "statements/same.pdf"]
    put_keys(s3, bucket, keys)
    kind = _kind(weed, bucket)
    items, conditions = _listed(kind)
    s3.delete_object(Bucket=bucket, Key=keys[0])
    s3.put_object(Bucket=bucket, Key=keys[1], Body=b"re-rendered")

    # When the batch is deleted with its conditions
    results = kind.delete(items, LATER, conditions)

    # Then the gone key is deleted (idempotent), the rewritten one kept and said why
    assert [(r.key, r.outcome) for r in results] == [
        (keys[0], Outcome.DELETED),
        (keys[1], Outcome.SKIPPED),
        (keys[2], Outcome.DELETED),
    ]
    assert results[1].code == CHANGED_SINCE_LISTING
    assert list_keys(s3, bucket) == {keys[1]}


def test_an_item_without_a_condition_is_looked_up_and_deleted_only_if_old(weed, s3, bucket):
    # Given a batch from before conditions existed: one key old, one rewritten after the cutoff
    cutoff = seed_split(s3, bucket, ["statements/old.pdf"], ["statements/new.pdf"])
    kind = _kind(weed, bucket)

    # When it is deleted without conditions
    results = kind.delete(["statements/old.pdf", "statements/new.pdf"], cutoff)

    # Then the old key is deleted and the new one kept
    assert [r.outcome for r in results] == [Outcome.DELETED, Outcome.SKIPPED]
    assert list_keys(s3, bucket) == {"statements/new.pdf"}


def test_an_answer_that_does_not_account_for_a_key_is_checked_not_trusted(weed, s3, bucket):
    # Given a server answer that drops one key and names one that was never sent
    keys = [f"statements/k{i}.pdf" for i in range(4)]
    put_keys(s3, bucket, keys)
    kind = _kind(weed, bucket)
    items, conditions = _listed(kind)

    def mangle(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Deleted"] = [d for d in parsed.get("Deleted", []) if d["Key"] != keys[1]]
        parsed.setdefault("Errors", []).append({"Key": "statements/never-sent.pdf", "Code": "X"})

    kind.client.meta.events.register("after-call.s3.DeleteObjects", mangle)
    s3.put_object(Bucket=bucket, Key=keys[1], Body=b"%PDF-1.7 digest")  # same ETag: still there

    # When the batch is deleted, and keys[1] in fact survived on the server
    real = kind.client.delete_objects

    def delete_all_but_one(**kwargs: Any) -> Any:
        objects = [o for o in kwargs["Delete"]["Objects"] if o["Key"] != keys[1]]
        return real(Bucket=kwargs["Bucket"], Delete={**kwargs["Delete"], "Objects": objects})

    kind.client.delete_objects = delete_all_but_one  # type: ignore[method-assign]
    results = kind.delete(items, LATER, conditions)

    # Then the unaccounted key is not counted as deleted: it is still there, so it is retried
    outcomes = {r.key: r.outcome for r in results}
    assert outcomes[keys[1]] is Outcome.TRANSIENT
    assert {outcomes[k] for k in keys if k != keys[1]} == {Outcome.DELETED}
    assert list_keys(s3, bucket) == {keys[1]}


def test_all_versions_refuses_a_bucket_without_versioning(weed, s3, bucket):
    put_keys(s3, bucket, ["statements/a.pdf"])
    kind = _kind(weed, bucket, versions="all")

    with pytest.raises(PermanentError, match="versioning enabled") as err:
        list(kind.scan(LATER))
    assert err.value.code == "versioning_not_enabled"

    # and a null version handed to it anyway (a forged or old batch) is not deleted
    (result,) = kind.delete(["statements/a.pdf?versionId=null"], LATER)
    assert (result.outcome, result.code) == (Outcome.PERMANENT, "versioning_not_enabled")
    assert list_keys(s3, bucket) == {"statements/a.pdf"}


def test_a_version_is_deleted_by_its_id_and_confirmed(weed, s3):
    bucket = f"versioned-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    put_keys(s3, bucket, ["statements/a.pdf"])
    s3.put_object(Bucket=bucket, Key="statements/a.pdf", Body=b"second")
    kind = _kind(weed, bucket, versions="all")
    keys, conditions = _listed(kind)

    results = kind.delete(keys, LATER, conditions)

    assert len(keys) == 2
    assert conditions == []
    assert {r.outcome for r in results} == {Outcome.DELETED}
    assert s3.list_object_versions(Bucket=bucket).get("Versions", []) == []
