"""The lean ListObjectsV2 parser reads exactly what botocore's own parser reads, on any page.

Each body of the corpus is answered, over a stubbed HTTP layer, to a stock boto3
client (no hook) and to the client :func:`~digest_cleanup.kinds.s3_client.make_client`
builds (with the hook).  They must agree on every field the sweep and the paginator
read, or both refuse the page.  The corpus covers every XML escape (named, decimal
and hex, including the ones HTML decodes differently: ``&#133;``, ``&#128;``,
``&#x7f;``), every control character raw and escaped (XML 1.0 cannot carry most of
them even escaped, and botocore then refuses the page: so must the hook), non-ASCII
keys, URL-encoded keys, and the top-level elements before, between and after the
``<Contents>`` elements.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError

from digest_cleanup.kinds import s3_listing
from digest_cleanup.kinds.s3_client import fast_timestamp, make_client
from digest_cleanup.settings import Settings

ENDPOINT = "http://127.0.0.1:9"  # never reached: every response is served by a hook
NS = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
#: Code points whose numeric escapes the corpus holds: every C0 and C1 control, DEL,
#: the ones HTML maps through Windows-1252 (128, 133, 150, 159), markup characters,
#: and non-ASCII from two bytes to four.
CODE_POINTS = [*range(0x00, 0x21), *range(0x7F, 0xA1), 0x22, 0x26, 0x27, 0x3C, 0x3E]
CODE_POINTS += [0xE9, 0xFC, 0x20AC, 0x2028, 0x65E5, 0xFFFD, 0xFFFE, 0x1F600, 0x10FFFF]
NAMED = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
#: Escapes an HTML decoder takes and XML does not (upper-case X, no semicolon, HTML
#: names): botocore refuses such a page, and so must the hook.
NOT_XML = ["&#X41;", "&#65", "&hellip;", "&nbsp;", "&euro;", "&#;", "&#x;"]
#: How servers write an ETag's quotes.
TOKEN = "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
QUOTES = ["&quot;", "&#34;", '"']
#: The three fields of an object, as a bare string.
BARE = "<Key>k</Key><LastModified>2026-10-18T03:00:00Z</LastModified><ETag>e</ETag>"
STAMPS = ["2026-10-18T03:00:00.000Z", "2026-10-19T04:05:06Z", "2026-10-20T00:00:00+00:00"]


def escapes(code: int) -> list[str]:
    """Every numeric spelling of ``code``: decimal, hex in both cases, leading zeros."""
    return [f"&#{code};", f"&#x{code:x};", f"&#x{code:X};", f"&#x{code:06x};", f"&#{code:07d};"]


def contents(key: str, n: int, *, order: int = 0, extra: str = "") -> str:
    """One ``<Contents>``; ``order`` rotates its fields, as servers order them differently."""
    fields = [
        f"<Key>{key}</Key>",
        f"<LastModified>{STAMPS[n % len(STAMPS)]}</LastModified>",
        f"<ETag>{QUOTES[n % 3]}e{n:x}{QUOTES[n % 3]}</ETag>",
        f"<Size>{40 + n}</Size>",
        "<StorageClass>STANDARD</StorageClass>",
    ]
    k = order % len(fields)
    return "<Contents>" + "".join(fields[k:] + fields[:k]) + extra + "</Contents>"


def body(parts: list[str], *, ns: str = NS, head: str = "") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult{ns}>'
        f"<Name>b</Name><Prefix>statements/</Prefix><MaxKeys>1000</MaxKeys>{head}"
        + "".join(parts)
        + "</ListBucketResult>"
    ).encode()


def key_pages() -> Iterator[tuple[str, bytes]]:
    """Pages of keys holding each escape, each raw control character, and non-ASCII."""
    for code in CODE_POINTS:
        for spelling in escapes(code):
            keys = [f"statements/a{spelling}b.pdf", f"statements/{spelling}", "statements/ok.pdf"]
            yield (
                f"escape {spelling}",
                body([contents(k, n) for n, k in enumerate(keys)] + ["<KeyCount>3</KeyCount>"]),
            )
        if code < 0x110000 and not 0xD800 <= code < 0xE000:
            raw = chr(code)
            yield f"raw U+{code:04X}", body([contents(f"statements/x{raw}y.pdf", code)])
    for name in NAMED + NOT_XML:
        yield f"named {name}", body([contents(f"statements/a{name}b{name}.pdf", 7)])
    yield "CR LF raw", body([contents("statements/a\r\nb\rc.pdf", 1)])
    yield "non-ASCII", body([contents(k, n) for n, k in enumerate(["statements/ü", "日本/😀"])])


def order_pages() -> Iterator[tuple[str, bytes]]:
    """Pages whose top-level elements sit before, between and after the objects."""
    objects = [contents(f"statements/k{n:04d}&amp;.pdf", n, order=n) for n in range(4)]
    tops = {
        "token": f"<NextContinuationToken>{TOKEN}</NextContinuationToken>",
        "truncated": "<IsTruncated>true</IsTruncated>",
        "count": "<KeyCount>4</KeyCount>",
        "prefixes": "<CommonPrefixes><Prefix>statements/2026-10-25/</Prefix></CommonPrefixes>"
        "<CommonPrefixes><Prefix>statements/&#xd;&#133;/</Prefix></CommonPrefixes>",
        "encoding": "<EncodingType>url</EncodingType>",
        "start": "<StartAfter>statements/k&#x7f;</StartAfter>",
    }
    for (name, element), slot in itertools.product(tops.items(), range(len(objects) + 1)):
        parts = [*objects]
        parts.insert(slot, element)
        yield f"{name} at {slot}", body(parts)
    # Everything at once, shuffled among the objects, without a namespace too.
    mixed = [objects[0], tops["count"], objects[1], tops["token"], tops["prefixes"], objects[2]]
    mixed += [tops["truncated"], objects[3], tops["start"]]
    yield "mixed", body(mixed)
    yield "mixed, no namespace", body(mixed, ns="")
    yield "pretty-printed", body(["\n  " + part for part in mixed] + ["\n"])
    yield "CRLF between", body(["\r\n" + part for part in mixed])


def encoded_pages() -> Iterator[tuple[str, bytes]]:
    """URL-encoded pages, as S3 answers ``encoding-type=url``, and raw ones without it."""
    keys = [
        "statements/a%26b%3Cc%3E.pdf",
        "statements/%C3%BC%20sp+plus%2B.pdf",
        "statements/%01%0B%7F",
    ]
    parts = [contents(k, n) for n, k in enumerate(keys)]
    yield "url-encoded", body([*parts, "<EncodingType>url</EncodingType>"])
    yield "url-encoded, element first", body(["<EncodingType>url</EncodingType>", *parts])
    yield "not encoded although asked", body(parts)
    prefixes = "<CommonPrefixes><Prefix>statements/%0D%C2%85/</Prefix></CommonPrefixes>"
    yield "url-encoded prefixes", body([parts[0], prefixes, "<EncodingType>url</EncodingType>"])


def odd_pages() -> Iterator[tuple[str, bytes]]:
    """Pages a hand-written reader gets wrong: botocore's answer is the one that counts."""
    ok = contents("statements/a.pdf", 1)
    yield "empty page", body(["<KeyCount>0</KeyCount>"])
    yield (
        "comment holding an object",
        body(["<!-- <Contents><Key>ghost</Key></Contents> -->", ok, "<KeyCount>1</KeyCount>"]),
    )
    yield (
        "comment holding a token",
        body([ok, "<!-- </Contents> -->", "<NextContinuationToken>t</NextContinuationToken>", ok]),
    )
    yield "CDATA key", body([contents("<![CDATA[statements/<a>&amp;]]>", 2)])
    yield (
        "CDATA token",
        body([ok, "<NextContinuationToken><![CDATA[</Contents>]]></NextContinuationToken>", ok]),
    )
    yield (
        "attribute on Contents",
        body(
            [
                '<Contents a="1">' + BARE + "</Contents>",
                ok,
            ]
        ),
    )
    yield (
        "space in a tag",
        body(
            [
                "<Contents >" + BARE + "</Contents >",
                ok,
            ]
        ),
    )
    yield (
        "prefixed namespace",
        (
            b'<?xml version="1.0"?><s3:ListBucketResult xmlns:s3="http://s3.amazonaws.com/doc/2006-03-01/">'
            b"<s3:Contents><s3:Key>k</s3:Key><s3:LastModified>2026-10-18T03:00:00Z</s3:LastModified>"
            b"<s3:ETag>e</s3:ETag></s3:Contents><s3:IsTruncated>true</s3:IsTruncated>"
            b"<s3:NextContinuationToken>t</s3:NextContinuationToken></s3:ListBucketResult>"
        ),
    )
    yield (
        "two keys in one object",
        body([contents("statements/a", 1, extra="<Key>statements/b</Key>"), ok]),
    )
    yield (
        "no ETag",
        body(
            [
                "<Contents><Key>k</Key><LastModified>2026-10-18T03:00:00Z</LastModified></Contents>",
                ok,
            ]
        ),
    )
    yield "no timestamp", body(["<Contents><Key>k</Key><ETag>e</ETag></Contents>", ok])
    yield "empty key", body([contents("", 3), ok])
    yield "self-closed key", body([contents("", 3).replace("<Key></Key>", "<Key/>"), ok])
    yield "element inside a key", body([contents("statements/<b>x</b>y", 4), ok])
    yield "nested Contents", body(["<Contents>" + ok + "</Contents>", ok])
    yield (
        "object outside the result",
        body([ok]).replace(b"</ListBucketResult>", b"</ListBucketResult>" + ok.encode()),
    )
    yield (
        "internal entity",
        (
            b'<?xml version="1.0"?><!DOCTYPE ListBucketResult [<!ENTITY t "tok">]>'
            b"<ListBucketResult>"
            + ok.encode()
            + b"<NextContinuationToken>&t;</NextContinuationToken>"
            b"</ListBucketResult>"
        ),
    )
    yield (
        "Latin-1 declared",
        body([contents("statements/\u00fc", 1)]).replace(b"UTF-8", b"ISO-8859-1"),
    )
    yield "byte order mark", b"\xef\xbb\xbf" + body([ok])
    yield "cut mid-object", body([ok, ok])[:-40]
    yield (
        "error body",
        b"<?xml version='1.0'?><Error><Code>InternalError</Code><Message>x</Message></Error>",
    )
    yield "not XML", b"Service Unavailable"
    yield "Contents in another element", body(["<Wrapper>" + ok + "</Wrapper>", ok])


CORPUS = [*key_pages(), *order_pages(), *encoded_pages(), *odd_pages()]


class _Raw:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def stream(self, **_: Any) -> Any:
        yield self.payload


class Served:
    """A client whose every request is answered with :attr:`payload`, without a server."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.payload = b""
        client.meta.events.register("before-send.s3", self.respond)

    def respond(self, request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(
            request.url, 200, {"content-type": "application/xml"}, _Raw(self.payload)
        )

    def read(self, payload: bytes, **params: Any) -> Any:
        """What the sweep and the paginator read of a page, or the error it raised."""
        self.payload = payload
        try:
            response = self.client.list_objects_v2(Bucket="b", Prefix="statements/", **params)
        except ClientError as exc:
            return ("error", exc.response["Error"].get("Code"))
        response.pop("ResponseMetadata", None)
        response["Contents"] = [
            tuple(_plain(o.get(field)) for field in ("Key", "LastModified", "ETag"))
            for o in response.get("Contents", [])
        ]
        return response


def _plain(value: Any) -> Any:
    """A field as compared: botocore gives a repeated element as a list of elements."""
    if isinstance(value, list):
        return [getattr(item, "text", item) for item in value]
    return value


@pytest.fixture(scope="module")
def lean() -> Served:
    return Served(
        make_client(
            Settings(s3_endpoint_url=ENDPOINT, aws_access_key_id="k", aws_secret_access_key="s")
        )
    )


@pytest.fixture(scope="module")
def stock() -> Served:
    return Served(
        boto3.session.Session().client(
            "s3",
            endpoint_url=ENDPOINT,
            region_name="us-east-1",
            aws_access_key_id="k",
            aws_secret_access_key="s",
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        )
    )


@pytest.mark.parametrize(("name", "payload"), CORPUS, ids=[name for name, _ in CORPUS])
@pytest.mark.parametrize("encoding", [None, "url"])
def test_the_hook_reads_every_page_as_botocore_does(lean, stock, name, payload, encoding):
    # Given a page, and a listing that lets botocore ask for URL encoding or asks itself
    params = {"EncodingType": encoding} if encoding else {}

    # When the stock client and the client with the hook read it
    fast, slow = lean.read(payload, **params), stock.read(payload, **params)

    # Then they read the same keys, ETags, timestamps and continuation token, or
    # both refuse the page
    assert fast == slow


def _not_xml_char(payload: bytes) -> bool:
    """True when the page escapes a code point XML 1.0 has no place for."""
    for code in CODE_POINTS:
        allowed = code in (0x9, 0xA, 0xD) or 0x20 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD
        allowed = allowed or 0x10000 <= code <= 0x10FFFF
        if not allowed and any(s.encode() in payload for s in escapes(code)):
            return True
    return False


@pytest.mark.parametrize(
    ("name", "payload"),
    WELL_FORMED := [
        (n, p)
        for n, p in CORPUS
        if n.startswith(("escape", "token at", "mixed", "url-encoded")) and not _not_xml_char(p)
    ],
    ids=[name for name, _ in WELL_FORMED],
)
def test_the_hook_itself_reads_well_formed_pages(name, payload):
    # Given a well-formed page of objects (not one left to botocore)
    response = {"status_code": 200, "headers": {}, "body": payload}

    # When the hook reads it
    found = s3_listing.parse_contents(response, fast_timestamp)

    # Then it took every object out itself, and left every other element in place
    assert found is not None
    assert b"<Contents>" not in response["body"]
    for element in (b"NextContinuationToken", b"IsTruncated", b"KeyCount", b"CommonPrefixes"):
        assert payload.count(element) == response["body"].count(element)


def test_a_token_between_objects_keeps_the_paginator_going():
    # Given a first page whose continuation token sits between its objects, and a last page
    first = body(
        [
            contents("statements/a.pdf", 1),
            "<IsTruncated>true</IsTruncated><NextContinuationToken>t2</NextContinuationToken>",
            contents("statements/b.pdf", 2),
        ]
    )
    last = body([contents("statements/c.pdf", 3), "<IsTruncated>false</IsTruncated>"])
    asked: list[str] = []

    def respond(request: Any, **_: Any) -> AWSResponse:
        asked.append(request.url)
        payload = last if "continuation-token=t2" in request.url else first
        return AWSResponse(request.url, 200, {}, _Raw(payload))

    client = make_client(
        Settings(s3_endpoint_url=ENDPOINT, aws_access_key_id="k", aws_secret_access_key="s")
    )
    client.meta.events.register("before-send.s3", respond)

    # When the prefix is listed page by page
    pages = list(client.get_paginator("list_objects_v2").paginate(Bucket="b"))

    # Then the second page is asked for, and every key is listed
    assert [o["Key"] for p in pages for o in p["Contents"]] == [
        "statements/a.pdf",
        "statements/b.pdf",
        "statements/c.pdf",
    ]
    assert len(asked) == 2
