"""`status --watch` in a real terminal (a pseudo-terminal): live bars, rate, ETA, dead letters."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.demo.seed import digest_layout_keys, seed_keys
from tests.conftest import s3_targets
from tests.rig.stack import wait_for

pytestmark = pytest.mark.e2e

KEYS = digest_layout_keys("statements/", 3000, "2026-10-18")
COLUMNS, ROWS = 160, 20
#: Escape sequences: any CSI sequence, and the ones rich's live display redraws with.
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CURSOR_UP = "\x1b[1A"


def run_in_terminal(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` attached to a COLUMNS x ROWS pseudo-terminal; return its status and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color", "COLUMNS": str(COLUMNS), "LINES": str(ROWS)},
        start_new_session=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer has exited
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(OSError):
            os.close(master)


def test_status_watch_draws_live_progress_bars_in_a_terminal(make_stack, weed, bucket, proxy):
    # Given a run of six batches against a slow S3 that refuses one key
    seed_keys(weed.endpoint_url, bucket, KEYS)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) >= cutoff, 5, "the clock to pass the cutoff")
    proxy.deny_keys = {KEYS[42]}
    proxy.delay = 0.3
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=1)
    started = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert started.code == 0, started
    run_id = started.json()["run_id"]

    # When an operator watches it in a 160-column terminal
    argv = [stack.executable("digest-cleanup"), "status", run_id, "--watch"]
    code, raw = run_in_terminal(argv, stack.env, timeout=240)

    # Then the bars were redrawn in place as the run went on
    assert code == 1, raw[-2000:]  # complete_with_failures
    assert raw.count(CURSOR_UP) >= 3
    text = CSI.sub("", raw)
    partial = [int(done) for done in re.findall(r"(\d+)/~?6 batches", text)]
    assert any(n < 6 for n in partial), text[-2000:]
    assert re.search(r"ETA \d+(s|m\d\ds)", text), text[-2000:]
    assert re.search(r"\d[\d,]* keys/s", text)
    # and the last frame shows the whole run: listed, batches, the dead letter, how it ended
    last = text[text.rindex("3,000 listed") :]
    assert "6/6 batches" in last
    assert "dead letters 1" in last
    assert "complete_with_failures in " in last
    assert f"run {run_id}: complete_with_failures" in last
    # and nothing was drawn wider than the terminal
    assert max(len(line) for line in text.replace("\r", "\n").splitlines()) <= COLUMNS
