"""The HTTP side of the test proxies: a threaded server and the handler of one connection.

:class:`ProxyServer` accepts connections on loopback and remembers them, so that
stopping can close idle kept-alive ones too.  :class:`ProxyHandler` reads each
request whole, hands it to the proxy's rules (:class:`ProxyRules`, which
:class:`~tests.rig.proxy.ReverseProxy` is) and gives those rules the ways to answer:
forward it upstream, answer by itself, or drop the connection.  This module knows
the rules only by that protocol, so it does not import the proxy that uses it.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple, Protocol

from digest_cleanup.demo.servers import LOOPBACK
from tests.rig.s3_messages import error_body

__all__ = ["ProxyHandler", "ProxyRules", "ProxyServer", "UpstreamResponse"]

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
#: Statuses (besides 1xx) whose responses never carry a body.
_NO_BODY_STATUSES = frozenset({http.client.NO_CONTENT, http.client.NOT_MODIFIED})


class UpstreamResponse(NamedTuple):
    """The upstream's whole answer to one forwarded request."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class ProxyRules(Protocol):
    """What a connection's handler needs of its proxy: the upstream, and the rules."""

    #: Names the ``502`` answers the handler writes itself.
    label: str
    upstream_host: str
    upstream_port: int
    upstream_timeout: float

    def handle(self, request: ProxyHandler) -> None:
        """Answer one request (see :meth:`tests.rig.proxy.ReverseProxy.handle`)."""


class ProxyServer(ThreadingHTTPServer):
    """A threaded HTTP server that knows its open connections, so it can close them."""

    daemon_threads = True
    # The default backlog of 5 drops connections when a test opens dozens at once.
    request_queue_size = 256

    def __init__(self, proxy: ProxyRules, port: int) -> None:
        self.proxy = proxy
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__((LOOPBACK, port), ProxyHandler)

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


class ProxyHandler(BaseHTTPRequestHandler):
    """One client connection: the request being handled and the ways to answer it.

    :meth:`ProxyRules.handle` reads ``command``, ``path`` and ``headers`` and
    answers with :meth:`relay`, :meth:`exchange` and :meth:`send`, :meth:`reply` or
    :meth:`drop_connection`.
    """

    # HTTP/1.1 keeps client connections open between requests, as boto3 expects.
    protocol_version = "HTTP/1.1"
    # An idle client connection is closed after this many seconds.
    timeout = 120
    server: ProxyServer
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
        """Let the proxy's rules decide what happens to one request."""
        self.server.proxy.handle(self)

    # Every method goes through the same path; S3 clients use all of these.
    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_OPTIONS = do_PATCH = handle_request

    def read_body(self) -> bytes | None:
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

    def relay(self, body: bytes | None, *, drop: frozenset[str] = frozenset()) -> None:
        """Forward the request (less the ``drop`` headers) and send back the answer."""
        response = self.exchange(self.forward_headers(body, drop=drop), body)
        if response is not None:
            self.send(*response)

    def forward_headers(
        self, body: bytes | None, *, drop: frozenset[str] = frozenset()
    ) -> list[tuple[str, str]]:
        """The request's end-to-end headers in their order, with the body's length.

        ``drop`` names (in lower case) further headers to leave out.  Content-Length
        is set from the body actually sent, since a chunked request body is
        forwarded decoded and a rule may rewrite a body.
        """
        headers = [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in _HOP_BY_HOP
            and name.lower() != "content-length"
            and name.lower() not in drop
        ]
        if body is not None:
            headers.append(("Content-Length", str(len(body))))
        return headers

    def exchange(
        self, headers: list[tuple[str, str]], body: bytes | None
    ) -> UpstreamResponse | None:
        """Send the request upstream with these headers and body, and read the whole answer.

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
                message = f"{proxy.label}: upstream failed: {error!r}"
                self.reply(http.client.BAD_GATEWAY, error_body("BadGateway", message), [])
                return None
            if upstream.will_close:
                connection.close()
                self._upstream = None
            return UpstreamResponse(
                upstream.status, upstream.reason, upstream.getheaders(), payload
            )
        raise AssertionError("unreachable: the second attempt returns")

    def reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        """Answer the client directly with an XML body, as S3 sends its errors."""
        self.send(
            status,
            http.client.responses.get(status, ""),
            [
                ("Content-Type", "application/xml"),
                ("x-amz-request-id", uuid.uuid4().hex[:16].upper()),
                *headers,
            ],
            body,
        )

    def send(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
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

    def drop_connection(self) -> None:
        """Close the client's connection without a response, as an unreachable host would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
