"""What the progress view computes from a run: totals, estimates, rate and ETA."""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.model.run_view import RunView
from digest_cleanup.ops.progress import Rate, numbers, plain_view


def iso(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat()


def streaming(**fields: str) -> RunView:
    base = {
        "status": "running",
        "target": "statements",
        "created_at": iso(60),
        "expired_seen": "20000",
        "batch_size": "500",
        "listed": "5000",
        "expired": "5000",
        "batches": "10",
        "batches_done": "4",
        "deleted": "2000",
    }
    return RunView("statements-20261023T030000Z", base | fields)


def test_while_the_sweep_streams_the_totals_are_the_guards_estimate():
    n = numbers(streaming(), Rate())

    assert n.sweeping
    assert n.estimated
    assert (n.expected, n.batches_expected, n.batches) == (20_000, 40, 10)
    # One poll is no rate yet, so no ETA either.
    assert n.eta == "?"


def test_eta_follows_the_recent_rate_over_what_is_left():
    # Given a poll five seconds ago that saw nothing done yet
    rate = Rate()
    rate.samples = [(time.monotonic() - 5, 0)]

    n = numbers(streaming(), rate)

    # Then 2,000 keys in 5 s is 400 keys/s, and 18,000 keys are left: 45 s
    assert n.keys_per_second == pytest.approx(400, rel=0.01)
    assert n.eta == "45s"


def test_a_finished_run_shows_its_whole_average_and_how_it_ended():
    run = streaming(
        status="complete_with_failures",
        sweep_done="1",
        created_at=iso(100),
        ended_at=iso(0),
        expired="20000",
        batches="40",
        batches_done="40",
        deleted="19999",
        dead_lettered="1",
    )

    n = numbers(run, Rate())

    assert not n.estimated
    assert n.keys_per_second == pytest.approx(200)
    assert n.eta == "done"
    assert n.elapsed == "1m40s"


def test_a_log_file_gets_whole_lines_not_redraws():
    stream = io.StringIO()
    draw, close = plain_view(stream)

    draw(streaming())
    draw(streaming())  # within a few seconds: not written again
    draw(streaming(status="complete", sweep_done="1", batches="40", batches_done="40"))
    close()

    first, last = stream.getvalue().splitlines()
    assert "4/~40 batches" in first
    assert "(5,000 listing)" in first
    assert "\r" not in stream.getvalue()
    assert "40/40 batches" in last
    assert "complete in " in last
