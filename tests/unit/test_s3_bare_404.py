"""A DeleteObjects request answered with a bare 404 as a whole: every key fails, none is gone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from digest_cleanup.kinds import Outcome
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.settings import Settings

LATER = datetime(2026, 12, 1, tzinfo=UTC)


class MisroutedClient:
    """Answers every DeleteObjects with a 404 whose body names no S3 error code."""

    def delete_objects(self, **params: Any) -> dict[str, Any]:
        response = {"Error": {"Code": "", "Message": "Not Found"},
                    "ResponseMetadata": {"HTTPStatusCode": 404}}  # fmt: skip
        raise ClientError(response, "DeleteObjects")  # type: ignore[arg-type]


def test_a_delete_objects_answered_404_without_a_code_fails_every_key_as_unconfirmed() -> None:
    # Given a target whose DeleteObjects reaches something that is not S3
    settings = Settings(aws_access_key_id="k", aws_secret_access_key="s")
    kind = S3Kind("statements", S3Options(bucket="b", prefix="s/"), settings)
    kind._client = MisroutedClient()

    # When a batch is deleted
    results = kind.delete(["s/a.pdf", "s/b.pdf"], LATER, ['"e1"', '"e2"'])

    # Then no key is gone: each is a permanent failure naming the endpoint setting
    assert {(r.outcome, r.code) for r in results} == {(Outcome.PERMANENT, "not_found_unconfirmed")}
    assert all("CLEANUP_S3_ENDPOINT_URL" in r.message for r in results)
