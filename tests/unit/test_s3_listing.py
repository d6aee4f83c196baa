"""The lean ListObjectsV2 parser gives what botocore's own parser gives, or steps aside."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from digest_cleanup.errors import PermanentError
from digest_cleanup.kinds import s3_listing, s3_shards
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.kinds.s3_client import fast_timestamp, make_client
from digest_cleanup.settings import Settings

ENDPOINT = "http://127.0.0.1:9"  # never reached: every response is served by a hook


def page(*objects: tuple[str, str], truncated: bool = False, tail: str = "") -> bytes:
    """A ListObjectsV2 page as S3 writes it (URL-encoded keys, AWS element order).

    ETags alternate between AWS's escaped quotes and plain ones, as servers differ.
    """
    quotes = ("&quot;", '"')
    contents = "".join(
        f"<Contents><Key>{key}</Key><LastModified>{stamp}</LastModified>"
        f"<ETag>{quotes[n % 2]}e{n}{quotes[n % 2]}</ETag>"
        "<Size>40</Size><StorageClass>STANDARD</StorageClass></Contents>"
        for n, (key, stamp) in enumerate(objects)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix>statements/</Prefix><KeyCount>{len(objects)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType>"
        f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
        f"{contents}{tail}</ListBucketResult>"
    ).encode()


OBJECTS = [
    ("statements/2026-10-18/cust-0000001.pdf", "2026-10-18T03:00:00.000Z"),
    ("statements/a%26b%3Cc%3E.pdf", "2026-10-19T04:05:06.000Z"),
    ("statements/%C3%BC%20space%2Bplus.pdf", "2026-10-20T00:00:00Z"),
    ("statements/amp&amp;escaped.pdf", "2026-10-21T00:00:00Z"),
]


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def serve(client: Any, body: bytes, status: int = 200) -> None:
    """Answer every request of ``client`` with ``body``, without a server."""

    def respond(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, status, {"content-type": "application/xml"}, _Raw(body))

    client.meta.events.register("before-send.s3", respond)


@pytest.fixture
def lean() -> Any:
    return make_client(
        Settings(s3_endpoint_url=ENDPOINT, aws_access_key_id="k", aws_secret_access_key="s")
    )


@pytest.fixture
def stock() -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


def listed(client: Any) -> list[tuple[str, datetime, str]]:
    response = client.list_objects_v2(Bucket="b", Prefix="statements/")
    return [(o["Key"], o["LastModified"], o["ETag"]) for o in response.get("Contents", [])]


def test_keys_timestamps_and_etags_match_botocores_own_parser(lean, stock):
    # Given a page with plain, URL-encoded and XML-escaped keys
    for client in (lean, stock):
        serve(client, page(*OBJECTS))

    # When both clients list it
    fast, slow = listed(lean), listed(stock)

    # Then they agree on every key and timestamp, decoded the same way
    assert fast == slow
    assert fast[1] == (
        "statements/a&b<c>.pdf",
        datetime(2026, 10, 19, 4, 5, 6, tzinfo=UTC),
        '"e1"',
    )
    assert fast[3][0] == "statements/amp&escaped.pdf"
    assert [etag for _, _, etag in fast] == ['"e0"', '"e1"', '"e2"', '"e3"']


def test_the_top_level_fields_are_still_botocores(lean):
    serve(
        lean,
        page(
            *OBJECTS[:1], truncated=True, tail="<NextContinuationToken>t1</NextContinuationToken>"
        ),
    )

    response = lean.list_objects_v2(Bucket="b", Prefix="statements/")

    assert response["IsTruncated"] is True
    assert response["NextContinuationToken"] == "t1"
    assert response["KeyCount"] == 1
    assert set(response["Contents"][0]) == {"Key", "LastModified", "ETag"}


def test_an_empty_page_has_no_contents(lean):
    serve(lean, page())
    assert "Contents" not in lean.list_objects_v2(Bucket="b")


def test_a_200_with_an_error_body_is_still_an_error(lean):
    # Given S3's "200 OK" whose body is an error document
    serve(
        lean, b"<?xml version='1.0'?><Error><Code>InternalError</Code><Message>x</Message></Error>"
    )

    # Then botocore's check still turns it into an error
    with pytest.raises(ClientError):
        lean.list_objects_v2(Bucket="b")


def test_a_page_cut_off_mid_object_is_still_an_error(lean):
    # Given a page whose connection dropped inside the second object
    body = page(*OBJECTS)
    cut = body[: body.index(b"<Contents>", body.index(b"</Contents>")) + 30]
    serve(lean, cut)

    # Then the partial page is refused rather than half-read
    with pytest.raises(ClientError):
        lean.list_objects_v2(Bucket="b")


def test_common_prefixes_after_the_objects_stay_for_botocore(lean):
    # Given a delimited listing: objects, then the common prefixes
    tail = "<CommonPrefixes><Prefix>statements/2026-10-25/</Prefix></CommonPrefixes>"
    serve(lean, page(*OBJECTS[:1], tail=tail))

    # When it is listed
    response = lean.list_objects_v2(Bucket="b", Prefix="statements/", Delimiter="/")

    # Then both the objects and the prefixes are there
    assert [o["Key"] for o in response["Contents"]] == [OBJECTS[0][0]]
    assert response["CommonPrefixes"] == [{"Prefix": "statements/2026-10-25/"}]


def test_an_object_without_a_timestamp_is_left_to_botocore():
    body = page(*OBJECTS[:2]).replace(b"<LastModified>2026-10-18T03:00:00.000Z</LastModified>", b"")
    response = {"status_code": 200, "body": body}

    assert s3_listing.parse_contents(response, fast_timestamp) is None
    assert response["body"] == body


def test_interleaved_common_prefixes_stay_for_botocore():
    # Given common prefixes between two objects
    prefixes = b"<CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>"
    body = page(*OBJECTS[:2]).replace(
        b"</Contents><Contents>", b"</Contents>" + prefixes + b"<Contents>"
    )
    response = {"status_code": 200, "body": body}

    # When the hook reads the page
    contents = s3_listing.parse_contents(response, fast_timestamp)

    # Then it takes both objects, and leaves the prefixes where they were
    assert contents is not None
    assert [o["Key"] for o in contents] == [key for key, _ in OBJECTS[:2]]
    assert prefixes in response["body"]
    assert b"<Contents>" not in response["body"]


def test_deletes_on_the_same_client_still_report_per_key_errors(lean):
    # Given a DeleteObjects answer with one per-key error
    serve(
        lean,
        b"<?xml version='1.0'?><DeleteResult><Error><Key>k2</Key><Code>AccessDenied</Code>"
        b"<Message>no</Message></Error></DeleteResult>",
    )

    # When a batch is deleted through the client that also lists
    response = lean.delete_objects(
        Bucket="b", Delete={"Objects": [{"Key": "k1"}, {"Key": "k2"}], "Quiet": True}
    )

    # Then the error is parsed as before
    assert response["Errors"] == [{"Key": "k2", "Code": "AccessDenied", "Message": "no"}]


def _truncated_without_token() -> bytes:
    """A first page that says more keys follow but not where from."""
    return page(*OBJECTS[:2], truncated=True)


@pytest.mark.parametrize("delimited", [False, True])
def test_a_page_that_cannot_be_followed_fails_the_listing(lean, delimited):
    # Given a server whose truncated page carries no continuation token
    serve(lean, _truncated_without_token())

    # When the sweep lists the prefix in key order, or its folders
    def listing() -> Any:
        if delimited:
            return s3_shards.segments(lean, "b", "statements/", 1000, complete=True)
        return list(s3_shards.pages(lean, "b", "statements/", "statements/0", 1000))

    # Then the listing fails naming why, instead of ending after one page
    with pytest.raises(PermanentError, match="NextContinuationToken"):
        listing()


def test_verify_refuses_a_page_that_cannot_be_followed(stock):
    # Given verify's stock client, answered by a server that drops the token
    serve(stock, _truncated_without_token())
    settings = Settings(s3_endpoint_url=ENDPOINT, aws_access_key_id="k", aws_secret_access_key="s")
    kind = S3Kind("statements", S3Options(bucket="b", prefix="statements/"), settings)
    kind.__dict__["verify_client"] = stock

    # Then verify fails instead of counting one page as the whole prefix
    with pytest.raises(PermanentError, match="NextContinuationToken"):
        kind.remaining(datetime(2030, 1, 1, tzinfo=UTC))


def _unencoded_with_replacement() -> bytes:
    """A page from a server that ignored encoding-type=url and could not write a character."""
    return page(("statements/a\ufffdb.pdf", "2026-10-18T03:00:00Z")).replace(
        b"<EncodingType>url</EncodingType>", b""
    )


@pytest.mark.parametrize("start_after", ["statements/0", None])
def test_a_key_the_server_could_not_write_fails_the_listing(lean, start_after):
    # Given a server that ignored encoding-type=url and wrote U+FFFD for a character
    serve(lean, _unencoded_with_replacement())

    # Then the sweep's listing fails naming the key, instead of expiring a name whose
    # delete answers "deleted" while the object stays
    with pytest.raises(PermanentError, match="a\ufffdb") as raised:
        list(s3_shards.pages(lean, "b", "statements/", start_after, 1000))
    assert raised.value.code == "listing_not_encoded"


def test_verify_refuses_a_key_the_server_could_not_write(stock):
    serve(stock, _unencoded_with_replacement())
    settings = Settings(s3_endpoint_url=ENDPOINT, aws_access_key_id="k", aws_secret_access_key="s")
    kind = S3Kind("statements", S3Options(bucket="b", prefix="statements/"), settings)
    kind.__dict__["verify_client"] = stock

    with pytest.raises(PermanentError) as raised:
        kind.remaining(datetime(2030, 1, 1, tzinfo=UTC))
    assert raised.value.code == "listing_not_encoded"


def test_an_encoded_replacement_character_is_a_key_like_any_other(lean):
    # Given a URL-encoded page whose key really holds U+FFFD
    serve(lean, page(("statements/a%EF%BF%BDb.pdf", "2026-10-18T03:00:00Z")))

    # Then it is listed as stored
    listed = [o["Key"] for p, _ in s3_shards.pages(lean, "b", "statements/", "x", 1000) for o in p]
    assert listed == ["statements/a\ufffdb.pdf"]
