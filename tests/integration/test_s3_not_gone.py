"""What the S3 kind may count as gone or as changed, against a real S3 server behind faults.

A key is ``deleted`` only when the store says it is gone with an S3 error code
(``NoSuchKey``), never on a bare 404 that any gateway can answer; and it is
``changed_since_listing`` only when a look shows its ETag changed, never on a
``PreconditionFailed`` alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from digest_cleanup.kinds import CHANGED_SINCE_LISTING, Outcome
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.settings import Settings
from tests.conftest import list_keys, put_keys
from tests.rig.faults import FaultProxy

LATER = datetime.now(UTC) + timedelta(days=1)
#: A key XML 1.0 cannot carry, so it is deleted alone with DeleteObject.
ODD = "statements/ctrl\x01char.pdf"


def _kind(endpoint_url: str, bucket: str) -> S3Kind:
    settings = Settings(
        s3_endpoint_url=endpoint_url, aws_access_key_id="k", aws_secret_access_key="s"
    )
    return S3Kind("statements", S3Options(bucket=bucket, prefix="statements/"), settings)


def _listed(kind: S3Kind) -> tuple[list[str], list[str]]:
    keys: list[str] = []
    conditions: list[str] = []
    for page in kind.scan(LATER):
        keys += page.expired
        conditions += page.conditions
    return keys, conditions


def _results(kind: S3Kind) -> dict[str, Any]:
    keys, conditions = _listed(kind)
    return {r.key: r for r in kind.delete(keys, LATER, conditions)}


def test_a_bare_404_from_head_or_delete_object_is_a_failure_not_a_deletion(
    s3: Any, bucket: str, proxy: FaultProxy
) -> None:
    # Given three expired keys: one a gateway refuses as PreconditionFailed and then
    # answers 404 without an S3 code on HEAD and GET, one (which goes alone in a
    # DeleteObject) answered the same bare 404, and one reaching S3 normally
    keys = ["statements/refused.pdf", ODD, "statements/normal.pdf"]
    put_keys(s3, bucket, keys)
    kind = _kind(proxy.endpoint_url, bucket)
    proxy.precondition_failed_keys = frozenset(keys[:1])
    proxy.not_found_keys = frozenset(keys[:2])

    # When the batch is deleted
    results = _results(kind)

    # Then neither 404 counts as gone: both are permanent failures naming the endpoint
    # setting, both keys are still there, and only the normal key is deleted
    for key in keys[:2]:
        assert (results[key].outcome, results[key].code) == (
            Outcome.PERMANENT,
            "not_found_unconfirmed",
        ), results[key]
        assert "CLEANUP_S3_ENDPOINT_URL" in results[key].message
    assert results[keys[2]].outcome is Outcome.DELETED
    assert list_keys(s3, bucket) == set(keys[:2])
    assert proxy.faults_injected["bare_404"] >= 2


def test_a_key_gone_with_nosuchkey_after_a_refused_delete_is_deleted(
    s3: Any, bucket: str, proxy: FaultProxy
) -> None:
    # Given a listed key refused as PreconditionFailed and then deleted by someone else
    key = "statements/gone.pdf"
    put_keys(s3, bucket, [key])
    kind = _kind(proxy.endpoint_url, bucket)
    listed, conditions = _listed(kind)
    s3.delete_object(Bucket=bucket, Key=key)
    proxy.precondition_failed_keys = frozenset({key})

    # When it is deleted (S3's HEAD says 404 with no code; its GET says NoSuchKey)
    (result,) = kind.delete(listed, LATER, conditions)

    # Then the store's NoSuchKey settles it: gone, counted deleted
    assert result.outcome is Outcome.DELETED, result


def test_precondition_failed_on_an_object_with_its_listed_etag_is_condition_mismatch(
    s3: Any, bucket: str, proxy: FaultProxy
) -> None:
    # Given two listed keys the endpoint refuses as PreconditionFailed: one unchanged,
    # one really rewritten since the listing
    keys = ["statements/unchanged.pdf", "statements/rewritten.pdf"]
    put_keys(s3, bucket, keys)
    kind = _kind(proxy.endpoint_url, bucket)
    listed, conditions = _listed(kind)
    s3.put_object(Bucket=bucket, Key=keys[1], Body=b"re-rendered after the listing")
    proxy.precondition_failed_keys = frozenset(keys)

    # When the batch is deleted
    results = {r.key: r for r in kind.delete(listed, LATER, conditions)}

    # Then the unchanged one is a permanent failure of its own code, not a skip, and the
    # rewritten one is still changed_since_listing; both are kept
    unchanged, rewritten = results[keys[0]], results[keys[1]]
    assert (unchanged.outcome, unchanged.code) == (Outcome.PERMANENT, "condition_mismatch")
    assert "conditional_deletes" in unchanged.message
    assert (rewritten.outcome, rewritten.code) == (Outcome.SKIPPED, CHANGED_SINCE_LISTING)
    assert list_keys(s3, bucket) == set(keys)


def test_a_key_whose_look_is_forbidden_is_settled_by_listing_it(
    s3: Any, bucket: str, proxy: FaultProxy
) -> None:
    # Given two expired keys whose deletes come back PreconditionFailed, and a store that
    # answers 403 to any HEAD or GET of them (AWS does for a missing key when the role may
    # list only its prefix, as the deploy policy grants); one is in fact gone already
    keys = ["statements/gone.pdf", "statements/kept.pdf"]
    put_keys(s3, bucket, keys)
    kind = _kind(proxy.endpoint_url, bucket)
    listed, conditions = _listed(kind)
    s3.delete_object(Bucket=bucket, Key=keys[0])
    proxy.precondition_failed_keys = frozenset(keys)
    proxy.forbidden_keys = frozenset(keys)

    # When the batch is deleted
    results = {r.key: r for r in kind.delete(listed, LATER, conditions)}

    # Then a listing of the key settles it: the gone one is deleted, and the one still
    # there with its listed ETag is a condition mismatch, not a retry forever
    assert results[keys[0]].outcome is Outcome.DELETED
    assert (results[keys[1]].outcome, results[keys[1]].code) == (
        Outcome.PERMANENT,
        "condition_mismatch",
    )
    assert list_keys(s3, bucket) == {keys[1]}
