"""A threaded reverse proxy in front of one S3 endpoint; a subclass decides each answer.

:class:`ReverseProxy` does the HTTP work every test proxy needs.  It accepts
connections on loopback and reads each request whole.  It forwards the request as
it came (method, target, headers and body) on a kept-alive upstream connection,
and sends back the response as it came.  Only hop-by-hop headers (Connection,
Transfer-Encoding, Expect, ...) are not passed on: a chunked body travels on with
a Content-Length, and the proxy answers ``100 Continue`` itself.  Stopping closes
every client connection, idle kept-alive ones included.

What happens to a request is decided in one method, :meth:`ReverseProxy.handle`.
By default it forwards the request unchanged, so the base class is a transparent
proxy.  A rule set overrides it and uses the :class:`ProxyHandler` it is given to
read the body, forward, answer by itself or drop the connection::

    class ReadOnly(ReverseProxy):
        def handle(self, request: ProxyHandler) -> None:
            body = request.read_body()
            if request.command == "PUT":
                request.reply(403, ACCESS_DENIED_BODY, [])
            else:
                request.relay(body)

:class:`~tests.rig.faults.FaultProxy` is the rule set the suite uses.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

from digest_cleanup.demo.servers import LOOPBACK
from tests.rig.proxy_connections import ProxyHandler, ProxyServer, UpstreamResponse

__all__ = ["ProxyHandler", "ReverseProxy", "UpstreamResponse"]


class ReverseProxy:
    """Serves a loopback port and passes each request to :meth:`handle`.

    Subclass it and override :meth:`handle` to decide what happens to a request;
    the rest (the port, threads, upstream connections, stopping) is done here.
    """

    #: Names the serving thread and the ``502`` answers the proxy writes itself.
    label = "proxy"

    def __init__(self, upstream_url: str, *, port: int = 0, upstream_timeout: float = 60.0) -> None:
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
        self._requested_port = port
        self._stopping = threading.Event()
        self._server: ProxyServer | None = None
        self._thread: threading.Thread | None = None

    def handle(self, request: ProxyHandler) -> None:
        """Answer one request; this default forwards it unchanged.

        Runs on the thread of the client's connection, so several run at once.
        Read the body before answering (unless dropping the connection), so that
        the next request on a kept-alive connection is read from its start.
        """
        request.relay(request.read_body())

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` on a handler thread; True if the proxy began stopping meanwhile."""
        return self._stopping.wait(seconds)

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
        self._server = ProxyServer(self, self._requested_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"{self.label.replace(' ', '-')}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every open connection and release the port."""
        server, thread = self._server, self._thread
        if server is None:
            return
        # Wakes handlers in pause(), so they end instead of forwarding.
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
