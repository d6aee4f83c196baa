"""On a realistic 1000-key page, the lean ListObjectsV2 parser reads what botocore's does.

The page and both parsers are also what ``python -m benchmarks.listing_parser``
times, for the figures :mod:`digest_cleanup.kinds.s3_listing` quotes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import botocore.handlers
import botocore.session
from botocore.awsrequest import AWSResponse

from digest_cleanup.kinds import s3_listing
from digest_cleanup.kinds.s3_client import fast_timestamp, make_client
from digest_cleanup.settings import Settings

#: Keys per page: what S3 returns at most, and what the sweep asks for.
PAGE_KEYS = 1000
ENDPOINT = "http://127.0.0.1:9"  # never reached: every response is served by a hook
CREDENTIALS = {"aws_access_key_id": "k", "aws_secret_access_key": "s"}

Parse = Callable[[bytes], list[dict[str, Any]]]


def page(*, entities: bool) -> bytes:
    """A realistic ListObjectsV2 page: 1000 keys with ETags, sizes and dates.

    With ``entities``, every tenth key holds XML character references.
    """
    rows = []
    for n in range(PAGE_KEYS):
        key = f"statements/2026-10-18/cust-{n:07d}.pdf"
        if entities and n % 10 == 0:
            key = f"statements/2026-10-18/a&amp;b&lt;c&gt;&#13;{n:07d}.pdf"
        rows.append(
            f"<Contents><Key>{key}</Key>"
            f"<LastModified>2026-10-18T03:{n % 60:02d}:07.{n % 1000:03d}Z</LastModified>"
            f"<ETag>&quot;{n:032x}&quot;</ETag><Size>{40_000 + n}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix>statements/</Prefix><KeyCount>{PAGE_KEYS}</KeyCount>"
        "<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
        + "".join(rows)
        + "<NextContinuationToken>t</NextContinuationToken></ListBucketResult>"
    ).encode()


def botocore_client() -> Any:
    """A client that parses listings with botocore's own parser, timestamps as ours do."""
    core = botocore.session.get_session()
    core.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=fast_timestamp
    )
    return boto3.Session(botocore_session=core, region_name="us-east-1", **CREDENTIALS).client(
        "s3", endpoint_url=ENDPOINT
    )


def lean_client() -> Any:
    return make_client(Settings(s3_endpoint_url=ENDPOINT, **CREDENTIALS))


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def listing_call(client: Any, body: bytes) -> Parse:
    """One whole ``list_objects_v2`` call answered with ``body``, as the sweep makes it."""

    def respond(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, 200, {"content-type": "application/xml"}, _Raw(body))

    client.meta.events.register("before-send.s3", respond)

    def call(_: bytes) -> list[dict[str, Any]]:
        contents: list[dict[str, Any]] = client.list_objects_v2(Bucket="b")["Contents"]
        return contents

    return call


def botocore_parse(body: bytes) -> list[dict[str, Any]]:
    """botocore's own work on a page: the 200-with-an-error check, then its parser."""
    response = {"status_code": 200, "headers": {}, "body": body}
    _ERROR_CHECK(_OPERATION, response)
    contents: list[dict[str, Any]] = _PARSER.parse(response, _OPERATION.output_shape)["Contents"]
    return contents


def lean_parse(body: bytes) -> list[dict[str, Any]]:
    """The lean parser's work on a page: the objects, then botocore on what is left."""
    response = {"status_code": 200, "headers": {}, "body": body}
    contents = s3_listing.parse_contents(response, fast_timestamp)
    _ERROR_CHECK(_OPERATION, response)
    _PARSER.parse(response, _OPERATION.output_shape)
    assert contents is not None
    return contents


#: botocore's check for a 200 with an error body, which the lean hook runs on the slim page.
_ERROR_CHECK = getattr(botocore.handlers, "_handle_200_error", lambda *_: None)
_SESSION = botocore.session.get_session()
_OPERATION = _SESSION.get_service_model("s3").operation_model("ListObjectsV2")
_FACTORY = _SESSION.get_component("response_parser_factory")
_FACTORY.set_parser_defaults(timestamp_parser=fast_timestamp)
_PARSER = _FACTORY.create_parser("rest-xml")


def _fields(contents: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(o["Key"], o["LastModified"], o["ETag"]) for o in contents]


def test_on_a_realistic_page_both_parsers_read_the_same_keys_dates_and_etags() -> None:
    for entities in (False, True):
        body = page(entities=entities)
        lean, stock = lean_parse(body), botocore_parse(body)
        assert len(lean) == PAGE_KEYS
        assert _fields(lean) == _fields(stock)
        assert _fields(listing_call(lean_client(), body)(body)) == _fields(stock)
    assert stock[0]["Key"] == "statements/2026-10-18/a&b<c>\r0000000.pdf"
