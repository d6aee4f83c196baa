"""ListObjectsV2 pages rewritten the ways S3-compatible servers write them, for the fault proxy.

A listing is valid XML in more than one form, and a client must read every one
the same.  :func:`rewrite` re-writes an upstream page, element by element and in
the same meaning, with any of :data:`REWRITES`:

* ``escape_controls`` - every control character (C0, DEL, C1) is written as a
  numeric character reference, decimal and hex in turn (``&#133;``, ``&#x7f;``),
  as S3 writes keys it is not asked to URL-encode.  Most C0 controls cannot be
  carried by XML 1.0 even so: a page holding one is not well-formed, and a
  client must refuse it rather than guess;
* ``ignore_encoding`` - the page answers as a server that ignores
  ``encoding-type=url``: keys and prefixes come back decoded, and the page has
  no ``<EncodingType>``;
* ``token_between`` - the page's other elements (``NextContinuationToken``,
  ``IsTruncated``, ``KeyCount``, ``CommonPrefixes``) move in between its
  ``<Contents>`` elements, where XML allows them and a page reader must still
  find them.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qs, unquote_plus, urlsplit
from xml.etree import ElementTree

__all__ = ["REWRITES", "is_list_objects_v2", "rewrite"]

#: The rewrites :func:`rewrite` knows (see the module docstring).
REWRITES = frozenset({"escape_controls", "ignore_encoding", "token_between"})
#: Elements whose text a server URL-encodes under ``encoding-type=url``.
_ENCODED = frozenset({"Key", "Prefix", "StartAfter", "Delimiter"})
#: Top-level elements ``token_between`` moves in among the objects.
_MOVED = frozenset({"NextContinuationToken", "IsTruncated", "KeyCount", "CommonPrefixes"})
_NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"


def is_list_objects_v2(command: str, path: str) -> bool:
    """Whether a request (path-style) is a ListObjectsV2."""
    parts = urlsplit(path)
    return command == "GET" and parse_qs(parts.query).get("list-type") == ["2"]


def rewrite(body: bytes, rewrites: Iterable[str]) -> bytes | None:
    """``body`` rewritten with ``rewrites``, or None for a body that is not a listing page."""
    chosen = frozenset(rewrites)
    unknown = chosen - REWRITES
    if unknown:
        raise ValueError(f"unknown listing rewrites {sorted(unknown)}; known: {sorted(REWRITES)}")
    try:
        root = ElementTree.fromstring(body)  # noqa: S314 - the test's own server's answer
    except ElementTree.ParseError:
        return None
    if _name(root) != "ListBucketResult":
        return None
    children = list(root)
    encoded = any(_name(c) == "EncodingType" and c.text == "url" for c in children)
    if "ignore_encoding" in chosen:
        children = [c for c in children if _name(c) != "EncodingType"]
    decode = encoded and "ignore_encoding" in chosen
    if "token_between" in chosen:
        children = _interleaved(children)
    writer = _Writer(escape_controls="escape_controls" in chosen, decode=decode)
    inner = "".join(writer.element(child) for child in children)
    page = f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_NAMESPACE}">'
    return (page + inner + "</ListBucketResult>").encode()


def _interleaved(children: list[ElementTree.Element]) -> list[ElementTree.Element]:
    """The page's elements with the moved ones right after its first object."""
    objects = [i for i, c in enumerate(children) if _name(c) == "Contents"]
    if not objects:
        return children
    moved = [c for c in children if _name(c) in _MOVED]
    rest = [c for c in children if _name(c) not in _MOVED]
    first = rest.index(children[objects[0]])
    return rest[: first + 1] + moved + rest[first + 1 :]


class _Writer:
    """Writes elements back as XML, decoding and escaping their text as asked."""

    def __init__(self, *, escape_controls: bool, decode: bool) -> None:
        self.escape_controls = escape_controls
        self.decode = decode
        self._written = 0

    def element(self, element: ElementTree.Element) -> str:
        name = _name(element)
        children = list(element)
        if children:
            return f"<{name}>" + "".join(self.element(c) for c in children) + f"</{name}>"
        text = element.text or ""
        if self.decode and name in _ENCODED:
            text = unquote_plus(text)
        return f"<{name}>{self.text(text)}</{name}>"

    def text(self, text: str) -> str:
        out = []
        for char in text:
            code = ord(char)
            if char in "&<>":
                out.append({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[char])
            elif char in "\t\n\r" or (self.escape_controls and _control(code)):
                # Decimal and hex in turn; a raw CR would be read back as a LF.
                self._written += 1
                out.append(f"&#{code};" if self._written % 2 else f"&#x{code:x};")
            elif _control(code) and code < 0x20:
                out.append("\ufffd")  # what a server that cannot escape it writes instead
            else:
                out.append(char)
        return "".join(out)


def _control(code: int) -> bool:
    return code < 0x20 or 0x7F <= code <= 0x9F


def _name(element: ElementTree.Element) -> str:
    return element.tag.rpartition("}")[2]
