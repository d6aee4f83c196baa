"""A kind in a package of its own, found by its entry point, tested with only the plugin.

The package in ``localdir_package/`` (the guide's filesystem example) is copied to
a directory outside this repository, next to the ``.dist-info`` an install would
write for it, and its own tests run there with pytest in a subprocess.  Nothing
is installed into this environment: the subprocess finds the package and its
entry point on its ``PYTHONPATH`` alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import digest_cleanup
from digest_cleanup.errors import TargetsFileError
from digest_cleanup.kinds import ENTRY_POINT_GROUP, load_kind
from digest_cleanup.testing.redis_server import find_redis_server, require

PACKAGE = Path(__file__).with_name("localdir_package")
#: Seconds the package's own test run may take.
RUN_TIMEOUT = 240


def _install_by_hand(source: Path, site: Path) -> None:
    """What ``pip install`` leaves for Python to find: the code and a ``.dist-info``."""
    shutil.copytree(source / "localdir_cleanup", site / "localdir_cleanup")
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    points = project["entry-points"][ENTRY_POINT_GROUP]
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
    )


def test_the_package_s_own_tests_pass_with_only_the_plugin(tmp_path: Path) -> None:
    # Given the package outside the repository, "installed" on a path of its own
    require(find_redis_server() is not None, "the plugin needs a Redis server")
    project, site = tmp_path / "localdir-cleanup", tmp_path / "site"
    shutil.copytree(PACKAGE, project, ignore=shutil.ignore_patterns("localdir_cleanup"))
    site.mkdir()
    _install_by_hand(PACKAGE, site)
    here = Path(digest_cleanup.__file__).resolve().parents[1]
    env = {
        **os.environ,
        # The package and its entry point, then digest-cleanup as this test imports it.
        "PYTHONPATH": os.pathsep.join([str(site), str(here)]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    # When its tests run there, in a process of their own
    report = tmp_path / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
         f"--junitxml={report}", "-q", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip

    # Then every one of them ran and passed: none skipped for want of a fixture
    output = done.stdout[-4000:] + done.stderr[-2000:]
    assert report.exists(), output
    suite = ET.parse(report).getroot().find("testsuite")  # noqa: S314 - our own subprocess's
    assert suite is not None, output
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    require(counts["skipped"] == 0, f"the package's tests skipped:\n{output}")
    assert done.returncode == 0, output
    assert counts == {"tests": 2, "failures": 0, "errors": 0, "skipped": 0}, output


def test_an_entry_point_not_yet_installed_is_named_with_the_reinstall_that_finds_it() -> None:
    # Given a kind whose entry point was added to pyproject.toml but not installed
    # When a targets file names it
    with pytest.raises(TargetsFileError) as refused:
        load_kind("localdir", target="digests")

    # Then the message names the setting, the known kinds and the fix
    message = str(refused.value)
    assert message.startswith("targets.digests.kind: unknown kind 'localdir'")
    assert "s3" in message
    assert "postgres" in message
    assert f"{ENTRY_POINT_GROUP!r} entry point group" in message
    assert "pip install -e ." in message
