"""Keys XML 1.0 cannot carry, through listings rewritten by the fault proxy, on a real server.

S3 writes such a key as ``&#x1;`` when a listing is not URL-encoded, which no XML
1.0 parser accepts: botocore refuses the page, and so must the sweep and verify,
loudly, instead of listing around it.  URL-encoded, the same key lists like any other.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.errors import StoreError
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.settings import Settings
from tests.conftest import list_keys, put_keys
from tests.rig.faults import FaultProxy

CONTROL = ["statements/2026-10-18/a\x01soh.pdf", "statements/2026-10-18/a\x0bvt.pdf"]
#: Past one 1000-key page, so the second page is reached through the token.
KEYS = [*CONTROL, *(f"statements/2026-10-18/cust-{i:05d}.pdf" for i in range(1010))]
LATER = datetime.now(UTC) + timedelta(days=1)


def _kind(proxy: FaultProxy, bucket: str) -> S3Kind:
    settings = Settings(
        s3_endpoint_url=proxy.endpoint_url, aws_access_key_id="k", aws_secret_access_key="s"
    )
    return S3Kind("statements", S3Options(bucket=bucket, prefix="statements/"), settings)


def _scanned(kind: S3Kind) -> list[str]:
    return [key for page in kind.scan(LATER) for key in page.expired]


@pytest.fixture
def control_bucket(s3: Any, bucket: str) -> str:
    put_keys(s3, bucket, KEYS)
    assert list_keys(s3, bucket) == set(KEYS)  # weed stores control characters as given
    return bucket


def test_url_encoded_listings_carry_control_characters(proxy, control_bucket):
    # Given listings with escaped controls and the token between the objects,
    # from a server that honours encoding-type=url
    proxy.listing_rewrites = frozenset({"escape_controls", "token_between"})
    kind = _kind(proxy, control_bucket)

    # When the sweep scans and verify counts
    scanned, remaining = _scanned(kind), kind.remaining(LATER)

    # Then both see every key, the control characters as stored
    assert sorted(scanned) == sorted(KEYS)
    assert remaining == len(KEYS)
    assert proxy.faults_injected["listing_rewritten"] >= 2


@pytest.mark.parametrize(
    ("rewrites", "code"),
    [
        # &#x1; in a page: not XML 1.0, so botocore turns the 200 into a 500
        ({"escape_controls", "ignore_encoding"}, "500"),
        # U+FFFD where the server could not write the character, as SeaweedFS does
        ({"ignore_encoding"}, "listing_not_encoded"),
    ],
)
def test_an_unencoded_page_that_cannot_name_a_key_fails_the_scan_and_verify(
    proxy, control_bucket, rewrites, code
):
    # Given a server that ignores encoding-type=url, and so cannot write a key with a
    # control character in a way XML 1.0 carries
    proxy.listing_rewrites = frozenset(rewrites)
    kind = _kind(proxy, control_bucket)

    # Then the sweep's scan and verify both fail rather than list around the key or
    # list another name for it
    with pytest.raises(StoreError) as scanning:
        _scanned(kind)
    with pytest.raises(StoreError) as verifying:
        kind.remaining(LATER)
    assert scanning.value.code == verifying.value.code == code
