"""Worker hosts of their own: network namespaces with a veth link each, and a way to cut it.

Each :class:`Host` is a network namespace joined to the root namespace by a veth
pair on a /30 of its own (``10.231.N.0/30``: ``.1`` on the root side, ``.2``
inside).  Redis and S3 listen on loopback in the root namespace, so a
:class:`Relay` per service listens on each host's root-side address and
forwards to them.  Taking the root side of a link down cuts that host off
without a reset: its connections hang, as when a switch port dies, and resume
when the link comes back.

Creating namespaces needs root (CI runs as root) and iproute2's ``ip``.  Every
namespace is deleted on :meth:`Host.destroy`, which deletes its veth pair too.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import threading
from collections.abc import Iterator, Sequence

from tests.rig.servers import LOOPBACK, require
from tests.rig.tools import require_tool

#: The second octet pair of every host subnet: 10.231.N.0/30, N = 1, 2, ...
SUBNET = "10.231"


def require_namespaces() -> None:
    """Skip (or fail, under CI) unless this process may create network namespaces."""
    require_tool("ip")
    require(os.geteuid() == 0, "network namespaces need root (CI runs as root)", install=None)


@contextlib.contextmanager
def worker_hosts(*indexes: int) -> Iterator[list[Host]]:
    """Hosts of these indexes (each its own 10.231.N.0/30), deleted again whatever happens."""
    require_namespaces()
    made: list[Host] = []
    try:
        for index in indexes:
            made.append(Host(index).create())
        yield made
    finally:
        for host in made:
            host.destroy()


class Host:
    """One worker host: a network namespace with a veth link to the root namespace."""

    def __init__(self, index: int) -> None:
        tag = f"{os.getpid() % 100_000}{index}"
        self.index = index
        self.namespace = f"dc-host-{tag}"
        #: The root side of the link (interface names are at most 15 characters).
        self.link = f"dch{tag}"[:15]
        self.inside = f"dcn{tag}"[:15]
        self.root_address = f"{SUBNET}.{index}.1"
        self.address = f"{SUBNET}.{index}.2"

    def create(self) -> Host:
        steps = [
            ["ip", "netns", "add", self.namespace],
            ["ip", "link", "add", self.link, "type", "veth", "peer", "name", self.inside],
            ["ip", "link", "set", self.inside, "netns", self.namespace],
            ["ip", "addr", "add", f"{self.root_address}/30", "dev", self.link],
            ["ip", "link", "set", self.link, "up"],
            *(
                ["ip", "netns", "exec", self.namespace, *cmd]
                for cmd in (
                    ["ip", "addr", "add", f"{self.address}/30", "dev", self.inside],
                    ["ip", "link", "set", self.inside, "up"],
                    ["ip", "link", "set", "lo", "up"],
                )
            ),
        ]
        try:
            for step in steps:
                _run(step)
        except Exception:
            self.destroy()
            raise
        return self

    def run_prefix(self) -> list[str]:
        """What to put before a command to run it on this host."""
        return ["ip", "netns", "exec", self.namespace]

    def cut(self) -> None:
        """Take the link down: the host's packets go nowhere, and nothing is reset."""
        _run(["ip", "link", "set", self.link, "down"])

    def heal(self) -> None:
        _run(["ip", "link", "set", self.link, "up"])

    def destroy(self) -> None:
        """Delete the namespace, and with it the veth pair; safe to call twice."""
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.link], capture_output=True, check=False)


class Relay:
    """Forwards TCP connections from ``address:port`` to a loopback port, both ways."""

    def __init__(self, address: str, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server((address, 0))
        self.address = address
        self.port = int(self._listener.getsockname()[1])
        self._stopping = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url_netloc(self) -> str:
        return f"{self.address}:{self.port}"

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((LOOPBACK, self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stopping.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.5)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
