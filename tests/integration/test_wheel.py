"""The built wheel ships the product, the kind author's test API and the demo, not the rig.

The wheel is built from a copy of the clone as a fresh clone would hold it (plus
uncommitted files), with pip's usual isolated build, and its file list is read.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.smoke.venv import source_copy

#: Modules of the test rig (tests/rig): none may ship, wherever in the wheel it sits.
RIG_MODULES = frozenset(
    {
        "aws_model.py",
        "aws_budget.py",
        "aws_records.py",
        "faults.py",
        "proxy.py",
        "proxy_connections.py",
        "s3_messages.py",
        "s3_listings.py",
        "webdriver.py",
        "tools.py",
    }
)
#: Classes and functions only the rig defines: the fault proxy, the AWS model, the
#: WebDriver client, the TLS/ACL Redis and the skip-or-fail server launchers.
RIG_DEFINITIONS = re.compile(
    r"^(class|def) (FaultProxy|ReverseProxy|AwsModel|WebDriver|TlsFiles|required_weed"
    r"|started_or_skip)\b",
    re.M,
)
#: What a kind author and the demo need: these ship.
SHIPPED = (
    "digest_cleanup/py.typed",
    "digest_cleanup/testing/plugin.py",
    "digest_cleanup/testing/pipeline.py",
    "digest_cleanup/testing/memory.py",
    "digest_cleanup/testing/dispatcher.py",
    "digest_cleanup/demo/__main__.py",
    "digest_cleanup/demo/cli.py",
    "digest_cleanup/demo/servers/redis.py",
    "digest_cleanup/demo/servers/weed.py",
    "digest_cleanup/demo/seed.py",
    "digest_cleanup/demo/stack.py",
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the clone, as the wheel is built from it."""
    return source_copy(tmp_path_factory.mktemp("wheel") / "source")


@pytest.fixture(scope="module")
def wheel(source: Path) -> zipfile.ZipFile:
    """The wheel ``pip wheel .`` builds from the copy of the clone."""
    out = source.parent / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--quiet", "-w", str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("digest_cleanup-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_carries_no_test_rig(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"digest_cleanup"}, tops
    shipped_rig = [name for name in names if Path(name).name in RIG_MODULES]
    assert shipped_rig == [], shipped_rig
    defining = [
        name
        for name in names
        if name.endswith(".py") and RIG_DEFINITIONS.search(wheel.read(name).decode())
    ]
    assert defining == [], defining
    # No seeding, server launchers or process stack under the kind author's package.
    testing = {Path(n).name for n in names if n.startswith("digest_cleanup/testing/")}
    assert not testing & {"seed.py", "stack.py", "servers", "__main__.py"}, testing
    assert not [n for n in names if n.startswith("digest_cleanup/testing/servers/")]


def test_the_wheel_carries_the_test_api_the_demo_and_the_scripts(
    wheel: zipfile.ZipFile, source: Path
) -> None:
    names = set(wheel.namelist())
    missing = [name for name in SHIPPED if name not in names]
    assert missing == [], missing
    scripts = {
        path.relative_to(source).as_posix() for path in (source / "digest_cleanup").rglob("*.lua")
    }
    assert scripts, "the store's scripts are .lua files in the package"
    assert scripts <= names, sorted(scripts - names)
