"""Live progress of a run: batches done of published, keys/s, ETA, dead letters.

Uses rich when it is installed (the ``ui`` extra) and the output is a terminal,
a plain one-line bar otherwise; with ``--json`` nothing is drawn at all.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from digest_cleanup.runs import RunStore, RunView

#: Seconds between polls of the run store.
POLL_SECONDS = 0.5
#: How long a waiter allows, after the final status, for the run's report to be written.
FINALIZE_GRACE_SECONDS = 15.0


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
    draw: Callable[[RunView], None] | None = None
    close: Callable[[], None] = lambda: None  # noqa: E731 - a no-op default
    if show:
        draw, close = _rich_view(stream) or _plain_view(stream)
    try:
        while True:
            run = store.get(run_id)
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


class _Rate:
    """Keys per second over a sliding window of recent polls."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []

    def update(self, done: int) -> float:
        now = time.monotonic()
        self.samples.append((now, done))
        self.samples = [s for s in self.samples if now - s[0] <= 10.0]
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


def _numbers(run: RunView, rate: _Rate) -> dict[str, Any]:
    done_keys = run.count("deleted") + run.count("dead_lettered") + run.count("skipped")
    per_second = rate.update(done_keys)
    sweeping = run.fields.get("sweep_done") != "1"
    left = max(run.count("expired") - done_keys, 0)
    eta = "?" if sweeping or per_second <= 0 else f"{left / per_second:,.0f}s"
    return {
        "batches_done": run.count("batches_done"),
        "batches": run.count("batches"),
        "keys_per_second": per_second,
        "eta": eta,
        "dead_lettered": run.count("dead_lettered"),
        "listed": run.count("listed"),
        "sweeping": sweeping,
        "deleted": run.count("deleted"),
    }


def _rich_view(stream: TextIO) -> tuple[Callable[[RunView], None], Callable[[], None]] | None:
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    except ImportError:
        return None
    console = Console(file=stream)
    if not console.is_terminal:
        return None
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("batches  {task.fields[rate]:>8,.0f} keys/s  ETA {task.fields[eta]}"),
        TextColumn("deleted {task.fields[deleted]:,}  dead letters {task.fields[dead]}"),
        console=console,
        transient=False,
    )
    rate = _Rate()
    task_id = progress.add_task("listing", total=None, rate=0.0, eta="?", dead=0, deleted=0)
    progress.start()

    def draw(run: RunView) -> None:
        n = _numbers(run, rate)
        progress.update(
            task_id,
            description=f"{run.fields.get('target', '')} "
            f"{'listing' if n['sweeping'] else 'deleting'}"
            f" ({n['listed']:,} listed)",
            total=None if n["sweeping"] and not n["batches"] else n["batches"],
            completed=n["batches_done"],
            rate=n["keys_per_second"],
            eta=n["eta"],
            dead=n["dead_lettered"],
            deleted=n["deleted"],
        )

    return draw, progress.stop


def _plain_view(stream: TextIO) -> tuple[Callable[[RunView], None], Callable[[], None]]:
    rate = _Rate()
    tty = stream.isatty()
    last = [0.0]

    def draw(run: RunView) -> None:
        n = _numbers(run, rate)
        total = n["batches"] or 1
        width = 30
        filled = int(width * min(n["batches_done"] / total, 1.0))
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {n['batches_done']}/{n['batches']} batches"
            f"{'+' if n['sweeping'] else ''}  {n['keys_per_second']:,.0f} keys/s  ETA {n['eta']}"
            f"  dead letters {n['dead_lettered']}"
        )
        if tty:
            stream.write("\r" + line)
        elif time.monotonic() - last[0] >= 5 or run.finished:
            stream.write(line + "\n")  # a log file gets a line every few seconds, not a flood
            last[0] = time.monotonic()
        stream.flush()

    def close() -> None:
        if tty:
            stream.write("\n")
            stream.flush()

    return draw, close
