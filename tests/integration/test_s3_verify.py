"""``verify`` counts what is left with botocore's stock listing, not with the sweep's reader."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.kinds import s3_listing
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.settings import Settings
from tests.conftest import put_keys

KEYS = [f"statements/2026-10-18/cust-{i:04d}.pdf" for i in range(40)]
LATER = datetime.now(UTC) + timedelta(days=1)


def _kind(weed: Any, bucket: str) -> S3Kind:
    settings = Settings(
        s3_endpoint_url=weed.endpoint_url, aws_access_key_id="k", aws_secret_access_key="s"
    )
    return S3Kind("statements", S3Options(bucket=bucket, prefix="statements/"), settings)


def test_a_reader_that_drops_keys_cannot_hide_them_from_verify(weed, s3, bucket, monkeypatch):
    # Given 40 expired keys, and a sweep reader that loses the last object of every page
    put_keys(s3, bucket, KEYS)
    lossy = s3_listing.parse_contents

    def drop_last(response_dict: dict[str, Any], timestamp_parser: Any) -> Any:
        contents = lossy(response_dict, timestamp_parser)
        return contents[:-1] if contents else contents

    monkeypatch.setattr(s3_listing, "parse_contents", drop_last)
    kind = _kind(weed, bucket)
    assert sum(len(page.expired) for page in kind.scan(LATER)) == len(KEYS) - 1

    # When verify counts what is left
    remaining = kind.remaining(LATER)

    # Then it counts every key: it lists without the sweep's reader
    assert remaining == len(KEYS)


@pytest.mark.parametrize("lean", [True, False])
def test_both_clients_list_the_same_keys(weed, s3, bucket, lean, monkeypatch):
    # Given expired keys, some with characters a listing escapes
    odd = ["statements/a&b<c>.pdf", "statements/tab\there.pdf", "statements/\u00fc\u65e5.pdf"]
    put_keys(s3, bucket, [*KEYS[:5], *odd])
    kind = _kind(weed, bucket)
    read = s3_listing.parse_contents
    taken: list[Any] = []

    def counted(response_dict: dict[str, Any], timestamp_parser: Any) -> Any:
        taken.append(read(response_dict, timestamp_parser))
        return taken[-1]

    monkeypatch.setattr(s3_listing, "parse_contents", counted)

    # When verify counts them, with or without the lean reader in the sweep's client
    client = kind.client if lean else kind.verify_client
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}

    # Then the keys are the ones stored, the lean reader read weed's page itself (it
    # did not leave it to botocore), and verify counts them all
    assert listed == {*KEYS[:5], *odd}
    assert [len(found or ()) for found in taken] == ([len(listed)] if lean else [])
    assert kind.remaining(LATER) == len(listed)
