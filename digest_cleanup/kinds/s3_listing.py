"""A lean parser for ListObjectsV2 pages: the sweep's hot path.

botocore parses a listing through its generic shape walker, and before that its
check for S3's "200 with an error body" parses the whole page once more with
ElementTree.  Measured on 1000-key pages (about 235 kB: keys, ETags, sizes,
dates, StorageClass; plain keys, and 10% of keys with XML entities), client CPU
per page with ``time.process_time``, the median of 15 runs of 20 pages, the two
alternating, three rounds on a shared 2-core machine:

* the whole ``list_objects_v2`` call: botocore's own parsing 28-54 ms, this
  parser 7-15 ms, 3.6x-4.0x;
* parsing alone: botocore 25-43 ms, this parser 5-9 ms, 4.3x-4.8x.

Both parse timestamps with ``datetime.fromisoformat`` (see ``make_client``).
botocore's parsing would add 21-39 ms of client CPU a page: 2.5-5 s on a run's
120,000 keys, 25-47 s on 1.2 million, and the guard pass, which must finish
before the first delete, is CPU-bound in the client.  Re-measure with
``python -m benchmarks.listing_parser``; once botocore is less than about twice
as slow, let the client parse.

:func:`install` hooks one client's ``before-parse`` event for ListObjectsV2:
the ``<Contents>`` elements are read with one regular expression, handed to
botocore as already-parsed ``Contents`` entries, and cut out of the body, so
botocore's parser and its error check only see the page's few top-level fields.
The check itself still runs on every page.  Anything unexpected (an error body,
a truncated page, interleaved ``CommonPrefixes``, a ``Contents`` without a key)
leaves the page untouched for botocore to handle as usual.

A client with the hook returns ``Key``, ``LastModified`` and ``ETag`` for each
listed object and nothing else: that is all a scan reads (the ETag becomes the
condition of the object's delete).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

#: The event the hook listens to (botocore names S3 ``s3`` in events).
EVENT = "before-parse.s3.ListObjectsV2"
#: One pass over a page finds the three fields of every object, in any order.
_FIELDS = re.compile(
    rb"<Key>([^<]*)</Key>|<LastModified>([^<]*)</LastModified>|<ETag>([^<]*)</ETag>"
)
#: How many fields of ``_FIELDS`` each ``<Contents>`` holds.
_PER_OBJECT = 3
_OPEN, _CLOSE = b"<Contents>", b"</Contents>"

Handler = Callable[..., None]


def install(
    client: Any, timestamp_parser: Callable[[str], datetime], error_check: Handler | None
) -> None:
    """Make ``client`` parse ListObjectsV2 pages with :func:`parse_contents`.

    ``error_check`` is botocore's check for a 200 response with an error body.
    botocore registers it first for every S3 operation, so it would parse the
    full page before this hook could slim it: for this client it is re-registered
    to skip ListObjectsV2, and the hook runs it itself on the slimmed page.  With
    ``None`` (a botocore release renamed it) the check keeps reading whole pages.
    """
    events = client.meta.events
    if error_check is not None:
        events.unregister("before-parse.s3.*", error_check)
        events.register_first("before-parse.s3.*", _skip_listing(error_check))

    def lean(
        response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **kw: Any
    ) -> None:
        contents = parse_contents(response_dict, timestamp_parser)
        if contents is not None:
            customized_response_dict["Contents"] = contents
        if error_check is not None:
            error_check(response_dict=response_dict, **kw)

    events.register(EVENT, lean)


def parse_contents(
    response_dict: dict[str, Any], timestamp_parser: Callable[[str], datetime]
) -> list[dict[str, Any]] | None:
    """Take the ``Contents`` out of a ListObjectsV2 response body, or None to leave it be.

    On success the body keeps everything but the ``<Contents>`` elements, and the
    entries are returned as botocore would give them (keys still URL-encoded when
    botocore asked for ``EncodingType=url``: its after-call handler decodes them).
    """
    body = response_dict.get("body")
    if response_dict.get("status_code") != 200 or not isinstance(body, bytes):
        return None
    start = body.find(_OPEN)
    if start < 0:
        return None
    end = body.rfind(_CLOSE) + len(_CLOSE)
    if end <= start or body.find(b"<CommonPrefixes>", start, end) >= 0:
        return None
    found = _FIELDS.findall(body, start, end)
    if len(found) != _PER_OBJECT * body.count(_OPEN, start, end):
        return None
    contents = []
    for fields in zip(*(found[i::_PER_OBJECT] for i in range(_PER_OBJECT)), strict=True):
        # Each match fills one of the three groups; join them per object, any order.
        key, stamp, etag = (b"".join(group) for group in zip(*fields, strict=True))
        if not key or not stamp or not etag:
            return None
        contents.append(
            {
                "Key": _text(key),
                "LastModified": timestamp_parser(stamp.decode("ascii")),
                "ETag": _text(etag),
            }
        )
    response_dict["body"] = body[:start] + body[end:]
    return contents


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8")
    if "&" in text:  # XML escapes (ETags are quoted: &quot;); a value never holds a literal '<'
        text = html.unescape(text)
    return text


def _skip_listing(check: Handler) -> Handler:
    """``check`` for every S3 operation but ListObjectsV2, whose hook runs it later."""

    def checked(operation_model: Any, **kw: Any) -> None:
        if operation_model.name != "ListObjectsV2":
            check(operation_model=operation_model, **kw)

    return checked
