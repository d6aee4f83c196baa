"""A lean reader for ListObjectsV2 pages: the sweep's hot path, on botocore's own XML parser.

botocore parses a listing twice: its check for S3's "200 with an error body"
builds an ElementTree of the whole page, then its parser builds another and walks
it shape by shape in Python, field by field.  The hook here builds the
tree once, with the very parser botocore uses (``ElementTree.XMLParser`` with a
``TreeBuilder``, UTF-8), reads each object's three fields straight off it, and
hands botocore a page with the objects cut out: its check and its parser then see
only the page's few other elements, wherever they stood.

Measured with ``python -m benchmarks.listing_parser`` on 1000-key pages (about
235 kB: keys, ETags, sizes, dates, StorageClass; plain keys, and 10% of keys with
XML escapes), client CPU per page with ``time.process_time``, the median of 15
runs of 20 pages, the two alternating, on a shared 2-core machine, quiet and then
busy (load average 5):

* parsing alone: botocore 18.6-28.0 ms, this reader 4.9-9.6 ms, 2.9x-3.8x;
* the whole ``list_objects_v2`` call: botocore 18.3-32.0 ms, with this reader
  5.8-11.2 ms, 2.8x-3.3x (the last run is in BENCHMARKS.md).

The regular-expression reader this one replaced took 4.6-5.0 ms a page in the
quiet comparison, this one 5.8-6.0 ms: reading a real XML tree costs about 1 ms a
page.  Both parse timestamps with ``datetime.fromisoformat`` (see ``make_client``).
botocore's own parsing would add 13-21 ms of client CPU a page: 1.5-2.5 s on a
run's 120,000 keys, 15-25 s on 1.2 million, and the guard pass, which must finish
before the first delete, is CPU-bound in the client.  Once botocore is less than
about twice as slow, drop the hook and let the client parse.

What it reads is botocore's reading by construction, and checked, not assumed:

* the tree is botocore's (same parser, same settings), so every XML escape,
  character reference and line-end rule is the parser's, and a page XML 1.0 does
  not allow (``&#x1;``, which S3 may send for a key with a control character when
  the listing is not URL-encoded) fails to parse and is left to botocore, which
  refuses it;
* each object's ``Key``, ``LastModified`` and ``ETag`` are the element texts
  botocore's parser would read (its namespace-blind names, its timestamp parser);
  keys are left URL-encoded for botocore's after-call handler to decode when the
  page says ``<EncodingType>url</EncodingType>`` and botocore asked for it;
* the page handed on is the original bytes less each ``<Contents>...</Contents>``
  element, and it is parsed again: unless its tree is the original tree without
  its objects (every other element, its text and its place), the hook steps
  aside, so no element (a ``NextContinuationToken`` between objects, a
  ``CommonPrefixes``) can be lost.

Anything else unexpected (an error body, a truncated page, an object without
one of its fields or with one twice, a field holding markup, a tag written
another way) leaves the page untouched for botocore to parse as usual.  Tested
against botocore's stock client on a corpus of such pages in
``tests/unit/test_s3_listing_corpus.py``.

A client with the hook returns ``Key``, ``LastModified`` and ``ETag`` for each
listed object and nothing else: that is all a scan reads (the ETag becomes the
condition of the object's delete).  ``verify`` lists with a stock client, so a
fault here cannot hide itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from xml.etree import ElementTree

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectTypeDef

#: The event the hook listens to (botocore names S3 ``s3`` in events).
EVENT = "before-parse.s3.ListObjectsV2"
#: The object fields a scan reads, by their element names.
FIELDS = ("Key", "LastModified", "ETag")
#: The encoding botocore's XML parser is created with (``RestXMLParser.DEFAULT_ENCODING``).
ENCODING = "utf-8"
_OPEN, _CLOSE = b"<Contents>", b"</Contents>"

Handler = Callable[..., None]
Element = ElementTree.Element
#: botocore's raw response as its before-parse event hands it over (``body``, ``headers``,
#: ``status_code``, ``context``): a plain dict that neither botocore nor its stubs type.
RawResponse = dict[str, Any]


class _Operation(Protocol):
    """What the error check's wrapper reads of botocore's ``OperationModel``."""

    name: str


def install(
    client: S3Client, timestamp_parser: Callable[[str], datetime], error_check: Handler | None
) -> None:
    """Make ``client`` read ListObjectsV2 pages with :func:`parse_contents`.

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
        response_dict: RawResponse, customized_response_dict: RawResponse, **kw: object
    ) -> None:
        contents = parse_contents(response_dict, timestamp_parser)
        if contents is not None:
            customized_response_dict["Contents"] = contents
        if error_check is not None:
            error_check(response_dict=response_dict, **kw)

    events.register(EVENT, lean)


def parse_contents(
    response_dict: RawResponse, timestamp_parser: Callable[[str], datetime]
) -> list[ObjectTypeDef] | None:
    """Take the ``Contents`` out of a ListObjectsV2 response body, or None to leave it be.

    On success the body keeps everything but the ``<Contents>`` elements, and the
    entries are returned as botocore would give them (keys still URL-encoded when
    the page is: botocore's after-call handler decodes them).
    """
    body = response_dict.get("body")
    if response_dict.get("status_code") != 200 or not isinstance(body, bytes):
        return None
    root = _tree(body)
    if root is None or _name(root) != "ListBucketResult":
        return None
    contents: list[ObjectTypeDef] = []
    kept: list[Element] = []
    names: dict[str, str] = {}  # tag -> its name, worked out once per tag and page
    for child in root:
        if (names.get(child.tag) or names.setdefault(child.tag, _name(child))) != "Contents":
            kept.append(child)
            continue
        entry = _object(child, timestamp_parser, names)
        if entry is None:
            return None
        contents.append(entry)
    if not contents:
        return None
    slim = _cut(body, len(contents))
    slim_root = None if slim is None else _tree(slim)
    if slim_root is None or not _same(root, slim_root, kept):
        return None
    response_dict["body"] = slim
    return contents


def _tree(body: bytes) -> Element | None:
    """The page's tree as botocore builds it, or None where botocore's parser fails."""
    # botocore parses this very body with this very parser (expat, whose amplification
    # limits stop entity bombs); defusedxml here would only hand such a page to it.
    parser = ElementTree.XMLParser(  # noqa: S314
        target=ElementTree.TreeBuilder(), encoding=ENCODING
    )
    try:
        parser.feed(body)
        root: Element = parser.close()
    except ElementTree.ParseError:
        return None
    return root


def _name(element: Element) -> str:
    """The tag without its namespace, as botocore's ``_node_tag`` reads it."""
    tag = element.tag
    return tag[tag.rfind("}") + 1 :]


def _object(
    element: Element, timestamp_parser: Callable[[str], datetime], names: dict[str, str]
) -> ObjectTypeDef | None:
    """One ``<Contents>`` as botocore parses it, or None unless it is plainly one object."""
    found: dict[str, str] = {}
    for field in element:
        tag = field.tag
        name = names.get(tag) or names.setdefault(tag, _name(field))
        if name not in FIELDS:
            continue
        text = field.text
        # Twice (botocore makes a list), empty or holding markup: botocore's to read.
        if name in found or not text or len(field):
            return None
        found[name] = text
    if len(found) != len(FIELDS):
        return None
    try:
        stamp = timestamp_parser(found["LastModified"])
    except (ValueError, TypeError, OverflowError):
        return None  # botocore's parser raises its own error for it
    return {"Key": found["Key"], "LastModified": stamp, "ETag": found["ETag"]}


def _cut(body: bytes, count: int) -> bytes | None:
    """``body`` without its ``count`` ``<Contents>`` elements, or None if they are not found.

    A ``<Contents>`` written another way (an attribute, a prefix, inside a comment)
    makes the count or the re-parse disagree, and the page is left whole.
    """
    pieces = []
    at = 0
    for _ in range(count):
        start = body.find(_OPEN, at)
        end = body.find(_CLOSE, start) if start >= 0 else -1
        if end < 0:
            return None
        pieces.append(body[at:start])
        at = end + len(_CLOSE)
    if body.find(_OPEN, at) >= 0:
        return None
    pieces.append(body[at:])
    return b"".join(pieces)


def _same(root: Element, slim: Element, kept: Iterable[Element]) -> bool:
    """Whether ``slim`` is ``root`` with only its ``<Contents>`` children taken out."""
    return (
        root.tag == slim.tag
        and root.attrib == slim.attrib
        and _same_children(list(kept), list(slim))
    )


def _same_children(left: list[Element], right: list[Element]) -> bool:
    if len(left) != len(right):
        return False
    return all(
        a.tag == b.tag
        and a.text == b.text
        and a.attrib == b.attrib
        and _same_children(list(a), list(b))
        for a, b in zip(left, right, strict=True)
    )


def _skip_listing(check: Handler) -> Handler:
    """``check`` for every S3 operation but ListObjectsV2, whose hook runs it later."""

    def checked(operation_model: _Operation, **kw: object) -> None:
        if operation_model.name != "ListObjectsV2":
            check(operation_model=operation_model, **kw)

    return checked
