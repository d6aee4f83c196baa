"""S3's XML messages and integrity headers, as the test proxies write and rewrite them.

A proxy that answers for S3 writes S3's error documents (:func:`error_body`); one
that refuses some keys of a DeleteObjects request takes them out of the body
(:func:`split_delete_body`), makes the integrity headers match the new body
(:func:`fix_integrity_headers`) and adds S3's per-key ``<Error>`` entries to the
answer (:func:`key_errors`, :func:`merge_errors`).
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from digest_cleanup.kinds.s3_probe import PROBE_PREFIX

__all__ = [
    "ACCESS_DENIED_BODY",
    "SLOWDOWN_BODY",
    "SLOWDOWN_MESSAGE",
    "DeleteRequest",
    "access_denied_entries",
    "delete_result",
    "error_body",
    "fix_integrity_headers",
    "is_delete_objects",
    "key_errors",
    "merge_errors",
    "split_delete_body",
]

_S3_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
_SELF_CLOSED_RESULT = re.compile(rb"(<DeleteResult\b[^>]*?)\s*/>")
_XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'


def error_body(code: str, message: str) -> bytes:
    """S3's error document for a whole request, e.g. ``error_body("SlowDown", ...)``."""
    return (
        f"{_XML_DECLARATION}<Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
    ).encode()


#: The answer to a request the caller may not make.
ACCESS_DENIED_BODY = error_body("AccessDenied", "Access Denied")
#: What S3 says when a request, or one key of a DeleteObjects, is over its request rate.
SLOWDOWN_MESSAGE = "Please reduce your request rate."
#: The answer to a request over S3's request rate (status 503).
SLOWDOWN_BODY = error_body("SlowDown", SLOWDOWN_MESSAGE)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


#: How to recompute each ``x-amz-checksum-<algorithm>`` header the standard library
#: can.  The others (CRC32C, CRC64NVME, XXHASH*) need awscrt; a request carrying one
#: of those is given a CRC32 checksum instead, which every S3 implementation accepts.
_CHECKSUMS: dict[str, Callable[[bytes], str]] = {
    "crc32": lambda body: _b64(zlib.crc32(body).to_bytes(4, "big")),
    "sha1": lambda body: _b64(hashlib.sha1(body, usedforsecurity=False).digest()),
    "sha256": lambda body: _b64(hashlib.sha256(body).digest()),
}
#: Every algorithm an ``x-amz-checksum-<algorithm>`` header can name.  Other
#: ``x-amz-checksum-*`` headers (``-type``, ``-algorithm``, ``-mode``) are not checksums.
_CHECKSUM_ALGORITHMS = frozenset(
    {"crc32", "crc32c", "crc64nvme", "sha1", "sha256", "md5", "xxhash64", "xxhash3", "xxhash128"}
)


def is_delete_objects(method: str, target: str) -> bool:
    """Whether a request (its method and request target) is a DeleteObjects call."""
    return method == "POST" and "delete" in parse_qs(urlsplit(target).query, keep_blank_values=True)


def is_probe_request(method: str, target: str, body: bytes | None) -> bool:
    """Whether a request is the conditions probe's (see :mod:`digest_cleanup.kinds.s3_probe`).

    True on a probe key, for a listing of one, and for a DeleteObjects of probe keys:
    the requests a run's start sends before the pipeline sends any.
    """
    parts = urlsplit(target)
    if PROBE_PREFIX in unquote(parts.path):
        return True
    if any(PROBE_PREFIX in prefix for prefix in parse_qs(parts.query).get("prefix", [])):
        return True
    return is_delete_objects(method, target) and body is not None and PROBE_PREFIX.encode() in body


@dataclass(frozen=True)
class DeleteRequest:
    """A parsed DeleteObjects body, split into the part to forward and the denied keys."""

    body: bytes
    forwarded_keys: list[str]
    denied: list[tuple[str, str | None]]


def split_delete_body(
    body: bytes,
    deny: frozenset[str] | Callable[[str], bool],
    *,
    strip_conditions: bool = False,
) -> DeleteRequest | None:
    """Parse a DeleteObjects body and drop the ``<Object>`` entries whose key is denied.

    ``deny`` is the set of keys to drop, or a function asked once for each
    ``<Object>``, in the body's order, whether to drop it; a function may keep
    state (such as how many keys of each prefix it has let through).  With
    ``strip_conditions`` every ``<ETag>`` condition is dropped too, as by a
    server that ignores conditions without saying so.  Returns None when the body
    is not the XML S3 expects, so that the caller forwards it untouched and lets the
    server answer MalformedXML.  The body is rewritten only when something was
    dropped; otherwise its bytes are kept as they came.
    """
    try:
        # The bodies come from the test's own clients on loopback, not from strangers.
        root = ElementTree.fromstring(body)  # noqa: S314
    except ElementTree.ParseError:
        return None
    namespace = root.tag[1:].partition("}")[0] if root.tag.startswith("{") else ""
    qualify = f"{{{namespace}}}" if namespace else ""
    forwarded: list[str] = []
    denied: list[tuple[str, str | None]] = []
    stripped = 0
    refuse = deny.__contains__ if isinstance(deny, frozenset) else deny
    kept: list[ElementTree.Element] = []
    for entry in root:
        if entry.tag != f"{qualify}Object":
            kept.append(entry)  # <Quiet>
            continue
        key = entry.findtext(f"{qualify}Key") or ""
        if refuse(key):
            denied.append((key, entry.findtext(f"{qualify}VersionId")))
            continue
        kept.append(entry)
        forwarded.append(key)
        for condition in entry.findall(f"{qualify}ETag") if strip_conditions else ():
            entry.remove(condition)
            stripped += 1
    if denied:
        # One assignment: removing entries one by one rescans the children each time,
        # and dropping 500 of 1,000 keys took 3.5 ms that way, 1.8 ms this way.
        root[:] = kept
    if denied or stripped:
        body = ElementTree.tostring(
            root, encoding="utf-8", xml_declaration=True, default_namespace=namespace or None
        )
    return DeleteRequest(body=body, forwarded_keys=forwarded, denied=denied)


def key_errors(refused: Iterable[tuple[str, str | None]], code: str, message: str) -> bytes:
    """Render S3's per-key ``<Error>`` entries, one per refused ``(key, version id)``.

    ``key_errors(refused, "SlowDown", SLOWDOWN_MESSAGE)`` gives the entries S3 puts
    in a DeleteObjects answer for keys over its request rate.
    """
    tail = f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
    parts = []
    for key, version in refused:
        version_xml = f"<VersionId>{escape(version)}</VersionId>" if version is not None else ""
        parts.append(f"<Error><Key>{escape(key)}</Key>{version_xml}{tail}")
    return "".join(parts).encode("utf-8")


def access_denied_entries(denied: Iterable[tuple[str, str | None]]) -> bytes:
    """Render S3's per-key ``AccessDenied`` entries for keys the proxy refused."""
    return key_errors(denied, "AccessDenied", "Access Denied")


def delete_result(entries: bytes) -> bytes:
    """A whole DeleteObjects answer holding only ``entries``, as S3 would write it."""
    opening = f'{_XML_DECLARATION}<DeleteResult xmlns="{_S3_XMLNS}">'.encode()
    return opening + entries + b"</DeleteResult>"


def merge_errors(result: bytes, injected: bytes) -> bytes:
    """Add the proxy's ``<Error>`` entries to an upstream ``<DeleteResult>`` document.

    S3 lists errors after the deleted keys; appending before the closing tag keeps
    that order.  An empty result may come self-closed (``<DeleteResult .../>``).
    """
    close_tag = result.rfind(b"</DeleteResult>")
    if close_tag >= 0:
        return result[:close_tag] + injected + result[close_tag:]
    return _SELF_CLOSED_RESULT.sub(
        lambda match: match.group(1) + b">" + injected + b"</DeleteResult>", result, count=1
    )


def fix_integrity_headers(headers: list[tuple[str, str]], body: bytes) -> list[tuple[str, str]]:
    """Make Content-MD5, x-amz-checksum-* and x-amz-content-sha256 match a new body.

    The SigV4 signature, which covers some of these headers, is left as it was:
    the proxy does not know the secret key.  ``weed mini`` without IAM does not
    check signatures, payload hashes or checksums (verified with deliberately
    wrong values), so a rewritten request is accepted there.
    """
    fixed: list[tuple[str, str]] = []
    for name, value in headers:
        lower = name.lower()
        if lower == "content-md5":
            value = _b64(hashlib.md5(body, usedforsecurity=False).digest())
        elif lower == "x-amz-content-sha256" and len(value) == 64:
            # Only a literal payload hash; UNSIGNED-PAYLOAD and STREAMING-* stay as is.
            value = hashlib.sha256(body).hexdigest()
        elif lower.removeprefix("x-amz-checksum-") in _CHECKSUM_ALGORITHMS:
            algorithm = lower.removeprefix("x-amz-checksum-")
            if algorithm not in _CHECKSUMS:
                name, algorithm = "x-amz-checksum-crc32", "crc32"
            value = _CHECKSUMS[algorithm](body)
        elif lower == "x-amz-sdk-checksum-algorithm" and value.lower() not in _CHECKSUMS:
            # Matches the header renamed to x-amz-checksum-crc32 just above.
            value = "CRC32"
        fixed.append((name, value))
    return fixed
