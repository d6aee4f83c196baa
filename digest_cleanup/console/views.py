"""What the console's pages show, computed from the run store: plain data, no HTML.

Kept apart from the handlers so that the figures (the accounting check, the
rate, the chart's points) are tested without a server, and so that each page
shows a run exactly as the CLI counts it (:func:`~digest_cleanup.ops.progress.numbers`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from digest_cleanup.model.run_view import RunView
from digest_cleanup.ops.progress import RATE_WINDOW_SECONDS, Rate, numbers
from digest_cleanup.store.budget import BudgetState

#: Not-deleted keys shown on one page of a run's page.
KEYS_PER_PAGE = 100
#: The progress chart's size in SVG user units (it scales with the page).
CHART_WIDTH, CHART_HEIGHT = 600, 160
#: Space around the plotted area, for the axis labels.
CHART_MARGIN = 30


def accounting(run: RunView) -> str:
    """``ok`` when a finished run accounts for every expired key, else what is missing.

    Every expired key ends deleted, dead-lettered or skipped; the difference
    (``-3``: three keys unaccounted for, ``+2``: two counted twice) is what an
    operator looks at.  A running run is not judged yet: it shows what is left.
    """
    done = run.count("deleted") + run.count("dead_lettered") + run.count("skipped")
    expired = run.count("expired")
    if run.fields.get("dry_run") == "1":
        return "dry run"
    if not run.finished:
        return f"{max(expired - done, 0):,} to go"
    return "ok" if done == expired else f"{done - expired:+,}"


def rate_from(samples: Sequence[tuple[float, int, int]], now: float | None = None) -> Rate:
    """A :class:`Rate` primed with the run's recent samples, as if this page had polled them."""
    now = time.time() if now is None else now
    mono = time.monotonic()
    rate = Rate()
    rate.samples = [
        (mono - (now - at), done) for at, _, done in samples if now - at <= RATE_WINDOW_SECONDS
    ]
    return rate


def delete_rate(state: BudgetState | None) -> str:
    """The delete rate against its budget, as ``status`` shows it."""
    if state is None:
        return "no budget"
    paused = f", paused {state.paused_for:.1f} s" if state.paused_for else ""
    return f"{state.rate:,.0f} of {state.ceiling:,.0f} keys/s{paused}"


def run_row(
    run: RunView, samples: Sequence[tuple[float, int, int]], budget: BudgetState | None
) -> dict[str, Any]:
    """One row of the runs table."""
    n = numbers(run, rate_from(samples))
    total = f"~{n.batches_expected:,}" if n.estimated and n.batches_expected else f"{n.batches:,}"
    return {
        "run_id": run.run_id,
        "status": run.status,
        "target": n.target,
        "expired": n.expired,
        "deleted": n.deleted,
        "dead_lettered": n.dead_lettered,
        "skipped": run.count("skipped"),
        "batches": f"{n.batches_done:,}/{total}",
        "keys_per_second": f"{n.keys_per_second:,.0f}",
        "eta": n.eta,
        "delete_rate": delete_rate(budget),
        "report_url": run.fields.get("report_url", ""),
        "accounting": accounting(run),
        "created_at": run.fields.get("created_at", ""),
        "running": not run.finished,
    }


@dataclasses.dataclass(frozen=True)
class Chart:
    """The progress chart's lines and labels, in SVG user units."""

    deleted: str
    done: str
    start: str
    end: str
    top: int

    @property
    def empty(self) -> bool:
        return not self.deleted


def chart(samples: Sequence[tuple[float, int, int]], started: float | None = None) -> Chart:
    """Deleted and keys done over time, as SVG polyline points (empty under two samples).

    ``started`` (the run's creation) adds the run's first point, nothing done yet.
    """
    if started is not None and (not samples or started < samples[0][0]):
        samples = [(started, 0, 0), *samples]
    if len(samples) < 2:
        return Chart("", "", "", "", 0)
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(max(s[2] for s in samples), 1)
    width, height = CHART_WIDTH - 2 * CHART_MARGIN, CHART_HEIGHT - 2 * CHART_MARGIN

    def points(column: int) -> str:
        out = []
        for sample in samples:
            x = CHART_MARGIN + width * (sample[0] - t0) / max(t1 - t0, 1e-9)
            y = CHART_MARGIN + height * (1 - sample[column] / top)
            out.append(f"{x:.1f},{y:.1f}")
        return " ".join(out)

    return Chart(points(1), points(2), _clock(t0), _clock(t1), top)


def page_of(items: Sequence[Any], page: int) -> tuple[list[Any], int, int]:
    """Items of page ``page`` (1-based, clamped), the page, and the number of pages."""
    pages = max(-(-len(items) // KEYS_PER_PAGE), 1)
    page = min(max(page, 1), pages)
    start = (page - 1) * KEYS_PER_PAGE
    return list(items[start : start + KEYS_PER_PAGE]), page, pages


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
