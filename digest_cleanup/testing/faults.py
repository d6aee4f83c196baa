"""A fault-injecting HTTP proxy to put in front of an S3 endpoint in tests.

Neither ``weed mini`` nor moto can throttle, drop connections or refuse single
keys on demand, so :class:`FaultProxy` sits between the code under test and the
real server and does it.  It forwards each request as it came (method, target,
headers and body) and each response as it came back, unless a fault applies.
Only hop-by-hop headers (Connection, Transfer-Encoding, Expect, ...) are not
passed on: a chunked body travels on with a Content-Length, and the proxy answers
``100 Continue`` itself::

    with FaultProxy(weed.endpoint_url) as proxy:
        proxy.slowdown_rate = 0.3          # 30 % of DeleteObjects get 503 SlowDown
        proxy.deny_keys = {"a/locked.pdf"}  # per-key AccessDenied, the rest deleted
        run_cleanup(endpoint_url=proxy.endpoint_url)
        assert not proxy.duplicate_deletes()

Every fault switch and counter is safe to use from any thread while requests flow.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import http.client
import math
import random
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from digest_cleanup.testing.servers import LOOPBACK

__all__ = ["FaultProxy"]

#: Headers that describe one hop, not the message; they are never forwarded.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        # The proxy already holds the whole body, so it answers 100-continue itself.
        "expect",
    }
)
#: The headers of a conditional DeleteObject, dropped under ``strip_conditions``.
_CONDITION_HEADERS = frozenset({"if-match", "if-none-match"})
#: Statuses (besides 1xx) whose responses never carry a body.
_NO_BODY_STATUSES = frozenset({http.client.NO_CONTENT, http.client.NOT_MODIFIED})
_S3_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
_SELF_CLOSED_RESULT = re.compile(rb"(<DeleteResult\b[^>]*?)\s*/>")
_XML_DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>\n'
_ACCESS_DENIED_BODY = (
    _XML_DECLARATION + b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)
_SLOWDOWN_BODY = (
    _XML_DECLARATION
    + b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)


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


@dataclass(frozen=True)
class _DeleteRequest:
    """A parsed DeleteObjects body, split into the part to forward and the denied keys."""

    body: bytes
    forwarded_keys: list[str]
    denied: list[tuple[str, str | None]]


def _split_delete_body(
    body: bytes, deny: frozenset[str], *, strip_conditions: bool = False
) -> _DeleteRequest | None:
    """Parse a DeleteObjects body and drop the ``<Object>`` entries whose key is denied.

    With ``strip_conditions`` every ``<ETag>`` condition is dropped too, as by a
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
    for entry in root.findall(f"{qualify}Object"):
        key = entry.findtext(f"{qualify}Key") or ""
        if key in deny:
            denied.append((key, entry.findtext(f"{qualify}VersionId")))
            root.remove(entry)
            continue
        forwarded.append(key)
        for condition in entry.findall(f"{qualify}ETag") if strip_conditions else ():
            entry.remove(condition)
            stripped += 1
    if denied or stripped:
        body = ElementTree.tostring(
            root, encoding="utf-8", xml_declaration=True, default_namespace=namespace or None
        )
    return _DeleteRequest(body=body, forwarded_keys=forwarded, denied=denied)


def _access_denied_entries(denied: Iterable[tuple[str, str | None]]) -> bytes:
    """Render S3's per-key ``<Error>`` entries for keys the proxy refused."""
    parts = []
    for key, version in denied:
        version_xml = f"<VersionId>{escape(version)}</VersionId>" if version is not None else ""
        parts.append(
            f"<Error><Key>{escape(key)}</Key>{version_xml}"
            "<Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        )
    return "".join(parts).encode("utf-8")


def _merge_errors(result: bytes, injected: bytes) -> bytes:
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


def _fix_integrity_headers(headers: list[tuple[str, str]], body: bytes) -> list[tuple[str, str]]:
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


class _ProxyServer(ThreadingHTTPServer):
    """A threaded HTTP server that knows its open connections, so it can close them."""

    daemon_threads = True
    # The default backlog of 5 drops connections when a test opens dozens at once.
    request_queue_size = 256

    def __init__(self, proxy: FaultProxy, port: int) -> None:
        self.proxy = proxy
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__((LOOPBACK, port), _ProxyHandler)

    def track(self, connection: socket.socket) -> None:
        """Remember a connection being served by the calling thread."""
        with self._connections_lock:
            self._connections[connection] = threading.current_thread()

    def untrack(self, connection: socket.socket) -> None:
        """Forget a connection whose handler is done."""
        with self._connections_lock:
            self._connections.pop(connection, None)

    def close_connections(self, timeout: float) -> None:
        """Shut down every open client connection and wait (bounded) for its thread.

        Keep-alive clients such as boto3 hold idle connections open indefinitely;
        without this their handler threads would outlive the proxy.
        """
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _thread in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for _connection, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))


class _ProxyHandler(BaseHTTPRequestHandler):
    """Handles the requests of one client connection, forwarding them upstream."""

    # HTTP/1.1 keeps client connections open between requests, as boto3 expects.
    protocol_version = "HTTP/1.1"
    # An idle client connection is closed after this many seconds.
    timeout = 120
    server: _ProxyServer
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet: tests read counters, not access logs."""

    def setup(self) -> None:
        """Register the connection so that stopping the proxy can close it."""
        super().setup()
        self.server.track(self.connection)

    def handle(self) -> None:
        """Serve requests until the client leaves, ignoring clients that vanish.

        Clients killed by a test, and connections dropped on purpose while down,
        would otherwise print a traceback for every broken pipe.
        """
        with contextlib.suppress(OSError):
            super().handle()

    def finish(self) -> None:
        """Close the upstream connection together with the client's."""
        try:
            with contextlib.suppress(OSError):
                super().finish()
        finally:
            self.server.untrack(self.connection)
            if self._upstream is not None:
                self._upstream.close()
                self._upstream = None

    def handle_request(self) -> None:
        """Apply the active faults to one request, forwarding it unless a fault answers."""
        proxy = self.server.proxy
        proxy._count_request()
        if proxy.down:
            proxy._count_fault("down")
            self._drop_connection()
            return
        body = self._read_body()
        delay = proxy.delay
        if delay > 0:
            proxy._count_fault("delay")
            if proxy._stopping.wait(delay):
                self._drop_connection()
                return
        deny_puts = proxy.deny_puts_under
        if deny_puts and self.command == "PUT" and urlsplit(self.path).path.startswith(deny_puts):
            proxy._count_fault("put_denied")
            self._reply(http.client.FORBIDDEN, _ACCESS_DENIED_BODY, [])
            return
        if self.command == "POST" and "delete" in parse_qs(
            urlsplit(self.path).query, keep_blank_values=True
        ):
            self._delete_objects(body)
        else:
            self._relay(body)

    # Every method goes through the same path; S3 clients use all of these.
    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_OPTIONS = do_PATCH = handle_request

    def _delete_objects(self, body: bytes | None) -> None:
        """Apply SlowDown and per-key denial to a DeleteObjects request."""
        proxy = self.server.proxy
        if proxy._roll_slowdown():
            proxy._count_fault("slowdown")
            self._reply(
                http.client.SERVICE_UNAVAILABLE,
                _SLOWDOWN_BODY,
                [("Retry-After", str(proxy.retry_after))],
            )
            return
        parsed = (
            None
            if body is None
            else _split_delete_body(body, proxy.deny_keys, strip_conditions=proxy.strip_conditions)
        )
        if parsed is None:
            self._relay(body)
            return
        if parsed.denied:
            proxy._count_fault("access_denied", len(parsed.denied))
        injected = _access_denied_entries(parsed.denied)
        if parsed.denied and not parsed.forwarded_keys:
            # Nothing left to delete: answer as S3 would, without a round trip.
            result = (
                _XML_DECLARATION
                + f'<DeleteResult xmlns="{_S3_XMLNS}">'.encode()
                + injected
                + b"</DeleteResult>"
            )
            self._reply(http.client.OK, result, [])
            return
        proxy._count_delete(parsed.forwarded_keys)
        headers = self._forward_headers(parsed.body)
        if parsed.body is not body:
            headers = _fix_integrity_headers(headers, parsed.body)
        response = self._exchange(headers, parsed.body)
        if response is None:
            return
        status, reason, response_headers, response_body = response
        if injected and status == http.client.OK:
            response_body = _merge_errors(response_body, injected)
        self._send(status, reason, response_headers, response_body)

    def _relay(self, body: bytes | None) -> None:
        """Forward the request unchanged and send back the upstream's answer."""
        response = self._exchange(self._forward_headers(body), body)
        if response is not None:
            self._send(*response)

    def _exchange(
        self, headers: list[tuple[str, str]], body: bytes | None
    ) -> tuple[int, str, list[tuple[str, str]], bytes] | None:
        """Send the request upstream and read the whole response.

        A kept-alive upstream connection may have been closed by the server while
        idle; that shows up as an error before any response, and the request is
        sent once more on a fresh connection.  Returns None after answering 502.
        """
        proxy = self.server.proxy
        for attempt in (1, 2):
            reused = self._upstream is not None
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=proxy.upstream_timeout
                )
            connection = self._upstream
            try:
                # skip_host: the client's own Host header is forwarded, as it was signed.
                connection.putrequest(
                    self.command, self.path, skip_host=True, skip_accept_encoding=True
                )
                for name, value in headers:
                    connection.putheader(name, value)
                connection.endheaders(body)
                upstream = connection.getresponse()
                payload = upstream.read()
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                self._upstream = None
                if reused and attempt == 1:
                    continue
                self._reply(
                    http.client.BAD_GATEWAY,
                    _XML_DECLARATION
                    + b"<Error><Code>BadGateway</Code><Message>"
                    + escape(f"fault proxy: upstream failed: {error!r}").encode()
                    + b"</Message></Error>",
                    [],
                )
                return None
            if upstream.will_close:
                connection.close()
                self._upstream = None
            return upstream.status, upstream.reason, upstream.getheaders(), payload
        raise AssertionError("unreachable: the second attempt returns")

    def _forward_headers(self, body: bytes | None) -> list[tuple[str, str]]:
        """The request's end-to-end headers in their order, with the body's length.

        Content-Length is set from the body actually sent, since a chunked request
        body is forwarded decoded and a DeleteObjects body may be rewritten.
        """
        dropped = _CONDITION_HEADERS if self.server.proxy.strip_conditions else frozenset()
        headers = [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in _HOP_BY_HOP
            and name.lower() != "content-length"
            and not (self.command == "DELETE" and name.lower() in dropped)
        ]
        if body is not None:
            headers.append(("Content-Length", str(len(body))))
        return headers

    def _read_body(self) -> bytes | None:
        """Read the request body (plain or chunked); None when the request has none."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Skip trailers up to the blank line that ends the message.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline(3)
            body: bytes | None = b"".join(chunks)
        elif "Content-Length" in self.headers:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        else:
            body = None
        return body

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        """Answer the client directly with an XML body."""
        self._send(
            status,
            http.client.responses.get(status, ""),
            [
                ("Content-Type", "application/xml"),
                ("x-amz-request-id", uuid.uuid4().hex[:16].upper()),
                *headers,
            ],
            body,
        )

    def _send(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        """Write a response: the upstream's headers, with Content-Length made right."""
        # HEAD, 1xx, 204 and 304 carry the upstream's Content-Length but no body.
        bodyless = self.command == "HEAD" or status < 200 or status in _NO_BODY_STATUSES
        self.send_response_only(status, reason)
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP_BY_HOP or (lower == "content-length" and not bodyless):
                continue
            self.send_header(name, value)
        if not bodyless:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not bodyless:
            self.wfile.write(body)

    def _drop_connection(self) -> None:
        """Close the client's connection without a response, as an unreachable host would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class FaultProxy:
    """A reverse proxy in front of an S3 endpoint that injects faults on demand.

    Faults, switchable at any time from any thread:

    * ``slowdown_rate`` - the share of DeleteObjects requests answered ``503
      SlowDown`` with ``Retry-After`` (``retry_after`` seconds) and not forwarded.
      The draw uses a ``random.Random(seed)``, so a run is reproducible.
    * ``down`` / :meth:`down_for` - every request has its connection closed without
      an answer, as when S3 is unreachable.
    * ``delay`` - seconds to wait before handling each request (a slow S3).
    * ``deny_keys`` - keys that DeleteObjects must not delete: they come back as
      per-key ``AccessDenied`` errors, while the other keys are deleted upstream.
    * ``deny_puts_under`` - a path (``/bucket/prefix``) under which every PUT is
      answered ``403 AccessDenied`` and not forwarded, as for a role that may not
      write there.
    * ``strip_conditions`` - delete conditions (DeleteObjects' per-object ``<ETag>``,
      DeleteObject's ``If-Match``) are dropped before forwarding, as by a server
      that ignores them without saying so.

    Counters: ``requests_total``, ``delete_requests`` (DeleteObjects forwarded
    upstream), ``deleted_key_counts`` (how often each key was in a forwarded
    DeleteObjects) and ``faults_injected`` by kind (``slowdown``, ``down``,
    ``delay``, and ``access_denied`` counted per key).
    """

    def __init__(
        self,
        upstream_url: str,
        *,
        port: int = 0,
        seed: int = 0,
        retry_after: int = 1,
        upstream_timeout: float = 60.0,
    ) -> None:
        """Prepare a proxy for ``upstream_url`` (``http://host:port``); :meth:`start` runs it.

        ``port`` 0 lets the kernel pick a free one when the proxy starts.
        """
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream_url must be http://host:port, not {upstream_url!r}")
        self.upstream_url = upstream_url
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.upstream_timeout = upstream_timeout
        self.retry_after = retry_after
        self._requested_port = port
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._slowdown_rate = 0.0
        self._delay = 0.0
        self._down_until = 0.0
        self._deny_keys: frozenset[str] = frozenset()
        #: Drop delete conditions before forwarding (see the class docstring).
        self.strip_conditions = False
        #: Refuse every PUT under this path (see the class docstring); "" refuses none.
        self.deny_puts_under = ""
        self._requests_total = 0
        self._delete_requests = 0
        self._deleted_key_counts: collections.Counter[str] = collections.Counter()
        self._faults: collections.Counter[str] = collections.Counter()
        self._stopping = threading.Event()
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    @property
    def port(self) -> int:
        """The port the proxy listens on (only known once it has started)."""
        if self._server is None:
            raise RuntimeError("the proxy is not running; call start() first")
        return int(self._server.server_address[1])

    @property
    def endpoint_url(self) -> str:
        """The URL to give the code under test instead of the real endpoint."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        """Bind the port and serve in a background thread; a no-op if already running."""
        if self._server is not None:
            return self
        self._stopping.clear()
        self._server = _ProxyServer(self, self._requested_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"fault-proxy-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every open connection and release the port."""
        server, thread = self._server, self._thread
        if server is None:
            return
        # Wakes handlers waiting out a delay, so they end instead of forwarding.
        self._stopping.set()
        server.shutdown()
        server.close_connections(timeout)
        server.server_close()
        if thread is not None:
            thread.join(timeout)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- fault switches

    @property
    def slowdown_rate(self) -> float:
        """The share (0.0-1.0) of DeleteObjects requests answered 503 SlowDown."""
        return self._slowdown_rate

    @slowdown_rate.setter
    def slowdown_rate(self, rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"slowdown_rate must be within 0.0-1.0, not {rate}")
        self._slowdown_rate = float(rate)

    @property
    def delay(self) -> float:
        """Seconds each request waits before it is handled."""
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"delay must be >= 0, not {seconds}")
        self._delay = float(seconds)

    @property
    def down(self) -> bool:
        """Whether the proxy drops every connection without answering."""
        return time.monotonic() < self._down_until

    @down.setter
    def down(self, value: bool) -> None:
        self._down_until = math.inf if value else 0.0

    def down_for(self, seconds: float) -> None:
        """Be down from now for ``seconds``, then recover by itself."""
        self._down_until = time.monotonic() + seconds

    @property
    def deny_keys(self) -> frozenset[str]:
        """Keys whose deletion DeleteObjects refuses with a per-key AccessDenied.

        Assign a new collection to change it (``proxy.deny_keys = {"k"}``); the
        value read back is a snapshot, so it cannot be changed in place by mistake.
        """
        return self._deny_keys

    @deny_keys.setter
    def deny_keys(self, keys: Iterable[str]) -> None:
        self._deny_keys = frozenset(keys)

    def clear_faults(self) -> None:
        """Turn every fault off; counters are kept."""
        self.slowdown_rate = 0.0
        self.delay = 0.0
        self.down = False
        self.deny_keys = frozenset()
        self.strip_conditions = False
        self.deny_puts_under = ""

    # -- counters

    @property
    def requests_total(self) -> int:
        """Requests received, whatever happened to them."""
        with self._lock:
            return self._requests_total

    @property
    def delete_requests(self) -> int:
        """DeleteObjects requests forwarded upstream."""
        with self._lock:
            return self._delete_requests

    @property
    def deleted_key_counts(self) -> collections.Counter[str]:
        """A copy of: key -> how many forwarded DeleteObjects requests named it."""
        with self._lock:
            return collections.Counter(self._deleted_key_counts)

    @property
    def faults_injected(self) -> collections.Counter[str]:
        """A copy of: fault kind -> how many times it was applied."""
        with self._lock:
            return collections.Counter(self._faults)

    def duplicate_deletes(self) -> dict[str, int]:
        """Keys sent upstream for deletion more than once, with their counts."""
        with self._lock:
            return {key: n for key, n in self._deleted_key_counts.items() if n > 1}

    def reset_counters(self) -> None:
        """Zero every counter (faults stay as they are)."""
        with self._lock:
            self._requests_total = 0
            self._delete_requests = 0
            self._deleted_key_counts.clear()
            self._faults.clear()

    # -- used by the handler threads

    def _count_request(self) -> None:
        with self._lock:
            self._requests_total += 1

    def _count_fault(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._faults[kind] += n

    def _count_delete(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._delete_requests += 1
            self._deleted_key_counts.update(keys)

    def _roll_slowdown(self) -> bool:
        # One lock around the draw keeps the seeded sequence the same in every run
        # (as long as requests arrive in the same order).
        with self._lock:
            rate = self._slowdown_rate
            return rate > 0 and self._random.random() < rate
