"""The one place that reads the wall clock and writes or reads stored times.

Every stored time is UTC, ISO 8601, with a ``Z``.  Tests that need a fixed time
pass one in rather than patching these.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal


def utcnow() -> datetime:
    """The current time in UTC, to the second: cutoffs and slots are never finer."""
    return datetime.now(UTC).replace(microsecond=0)


def now_iso(timespec: Literal["seconds", "milliseconds"] = "milliseconds") -> str:
    """Now in UTC as ISO 8601 with a ``Z``."""
    return datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def epoch_of(iso: str | None) -> float | None:
    """Seconds since the epoch for a stored ISO 8601 time, or None when absent or unreadable."""
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
