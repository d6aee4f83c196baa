"""Live progress of a run: batches done of published, keys/s, ETA, dead letters.

Uses rich when it is installed (the ``ui`` extra) and the output is a terminal:
one bar for the sweep (listing), one for the batches.  Otherwise a plain
one-line bar, redrawn in place on a terminal and written every few seconds to a
file; with ``--json`` nothing is drawn at all.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TextIO

from digest_cleanup.clock import epoch_of
from digest_cleanup.model.run_view import RunView
from digest_cleanup.store.runs import RunStore

#: Seconds between polls of the run store.
POLL_SECONDS = 0.5
#: How long a waiter allows, after the final status, for the run's report to be written.
FINALIZE_GRACE_SECONDS = 15.0
#: The keys/s figure averages over this many seconds of recent polls.
RATE_WINDOW_SECONDS = 10.0
#: Seconds between lines when the output is a file rather than a terminal.
PLAIN_LINE_SECONDS = 5.0

Draw = Callable[[RunView], None]


def wait(
    store: RunStore,
    run_id: str,
    *,
    show: bool,
    timeout: float | None = None,
    stream: TextIO | None = None,
) -> RunView:
    """Poll until the run is finished (or ``timeout``), drawing progress if ``show``."""
    stream = stream or sys.stderr
    deadline = None if timeout is None else time.monotonic() + timeout
    settled: float | None = None
    draw: Draw | None = None
    close: Callable[[], None] = lambda: None  # noqa: E731 - a no-op default
    if show:
        draw, close = rich_view(stream) or plain_view(stream)
    try:
        while True:
            run = store.runs.get(run_id)
            if draw:
                draw(run)
            if deadline is not None and time.monotonic() > deadline:
                return run
            if run.finished:
                # The report is written just after the final status; give it a moment.
                settled = settled or time.monotonic() + FINALIZE_GRACE_SECONDS
                if run.fields.get("finalized_at") or time.monotonic() > settled:
                    return run
            time.sleep(POLL_SECONDS)
    finally:
        close()


class Rate:
    """Keys per second over a sliding window of recent polls."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []

    def update(self, done: int) -> float:
        now = time.monotonic()
        self.samples.append((now, done))
        self.samples = [s for s in self.samples if now - s[0] <= RATE_WINDOW_SECONDS]
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


@dataclasses.dataclass(frozen=True)
class Numbers:
    """What the views show, computed from one poll of the run."""

    target: str
    status: str
    sweeping: bool
    listed: int
    expired: int
    #: Expired keys expected in all: exact after the sweep, the guard's count before.
    expected: int
    done_keys: int
    deleted: int
    dead_lettered: int
    batches_done: int
    batches: int
    #: The run's batch count once known, else an estimate from the guard's count.
    batches_expected: int
    estimated: bool
    keys_per_second: float
    eta: str
    elapsed: str
    finished: bool


def numbers(run: RunView, rate: Rate) -> Numbers:
    """Counts, rate and ETA for one poll (the rate is over recent polls, or the whole run)."""
    done_keys = run.count("deleted") + run.count("dead_lettered") + run.count("skipped")
    sweeping = run.fields.get("sweep_done") != "1"
    expired = run.count("expired")
    expected = max(expired, run.count("expired_seen")) if sweeping else expired
    batches = run.count("batches")
    size = run.count("batch_size")
    estimate = -(-expected // size) if sweeping and size else batches
    elapsed = _elapsed(run)
    per_second = rate.update(done_keys)
    if run.finished and elapsed is not None and elapsed >= 1:
        per_second = done_keys / elapsed  # the whole run's average, once it is over
    left = max(expected - done_keys, 0)
    if run.finished or (not sweeping and left == 0):
        eta = "done"
    elif per_second > 0 and (expected or not sweeping):
        eta = _duration(left / per_second)
    else:
        eta = "?"
    return Numbers(
        target=run.fields.get("target", ""),
        status=run.status,
        sweeping=sweeping,
        listed=run.count("listed"),
        expired=expired,
        expected=expected,
        done_keys=done_keys,
        deleted=run.count("deleted"),
        dead_lettered=run.count("dead_lettered"),
        batches_done=run.count("batches_done"),
        batches=batches,
        batches_expected=max(estimate, batches),
        estimated=sweeping,
        keys_per_second=per_second,
        eta=eta,
        elapsed=_duration(elapsed or 0.0),
        finished=run.finished,
    )


def _sweep_line(n: Numbers) -> tuple[str, str]:
    """The sweep bar's counts and detail texts."""
    if n.sweeping and not n.listed and not n.expected:
        return "counting", "guard pass: checking max_delete before anything is deleted"
    state = "listing" if n.sweeping else "listed"
    return f"{n.listed:,} {state}", f"{n.expired:,} expired found"


def _batch_line(n: Numbers) -> tuple[str, str]:
    """The batch bar's counts and detail texts."""
    if n.estimated:
        total = f"~{n.batches_expected:,}" if n.batches_expected else "?"
    else:
        total = f"{n.batches:,}"
    counts = f"{n.batches_done:,}/{total} batches"
    eta = f"ETA {n.eta}" if n.eta != "done" else f"{n.status} in {n.elapsed}"
    detail = (
        f"{n.deleted:,} deleted  {n.keys_per_second:,.0f} keys/s  {eta}  "
        f"dead letters {n.dead_lettered:,}"
    )
    return counts, detail


def rich_view(stream: TextIO) -> tuple[Draw, Callable[[], None]] | None:
    """Two live bars (sweep, batches) on a terminal; ``None`` without rich or a terminal."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn
    except ImportError:
        return None
    console = Console(file=stream)
    if not console.is_terminal:
        return None
    progress = Progress(
        TextColumn("[bold]{task.description:<8}"),
        BarColumn(bar_width=36),
        TextColumn("{task.fields[counts]:>16}"),
        # Two spaces apart, and no markup: the texts are plain and printed as they are.
        TextColumn(" {task.fields[detail]}", markup=False),
        console=console,
        transient=False,
    )
    rate = Rate()
    sweep = progress.add_task("sweep", total=None, counts="", detail="")
    batches = progress.add_task("batches", total=None, counts="", detail="")
    progress.start()

    def draw(run: RunView) -> None:
        n = numbers(run, rate)
        counts, detail = _sweep_line(n)
        # The listing's length is unknown until it ends: a pulsing bar until then.
        progress.update(
            sweep,
            description=n.target,
            total=None if n.sweeping else max(n.listed, 1),
            completed=n.listed,
            counts=counts,
            detail=detail,
        )
        counts, detail = _batch_line(n)
        progress.update(
            batches,
            description="batches",
            total=n.batches_expected or None,
            completed=n.batches_done,
            counts=counts,
            detail=detail,
        )

    return draw, progress.stop


def plain_view(stream: TextIO) -> tuple[Draw, Callable[[], None]]:
    """One text line: redrawn in place on a terminal, written every few seconds to a file."""
    rate = Rate()
    tty = stream.isatty()
    last = [0.0]

    def draw(run: RunView) -> None:
        n = numbers(run, rate)
        width = 30
        filled = int(width * min(n.batches_done / max(n.batches_expected, 1), 1.0))
        counts, detail = _batch_line(n)
        listing = f"  ({_sweep_line(n)[0]})" if n.sweeping else ""
        line = f"[{'#' * filled}{'.' * (width - filled)}] {counts}  {detail}{listing}"
        if tty:
            stream.write("\r" + line + "\033[K")
        elif time.monotonic() - last[0] >= PLAIN_LINE_SECONDS or run.finished:
            stream.write(line + "\n")  # a log file gets a line every few seconds, not a flood
            last[0] = time.monotonic()
        stream.flush()

    def close() -> None:
        if tty:
            stream.write("\n")
            stream.flush()

    return draw, close


def _elapsed(run: RunView) -> float | None:
    """Seconds since the run was created, or its whole length once it has ended."""
    start = epoch_of(run.fields.get("created_at"))
    if start is None:
        return None
    end = epoch_of(run.fields.get("ended_at")) if run.finished else None
    return max((end if end is not None else time.time()) - start, 0.0)


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h07m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
