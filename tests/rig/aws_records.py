"""What the AWS model records of the deletes it saw, and the queries over those records.

Every DeleteObjects and DeleteObject becomes an :class:`Arrival`;
:func:`max_window_keys` and :func:`accepted_rate` are pure queries over arrivals, and
:class:`DeleteRecords` is the thread-safe log :class:`~tests.rig.aws_model.AwsModel`
keeps them in, with the queries a test asks of a model.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Arrival", "DeleteRecords", "accepted_rate", "max_window_keys"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One DeleteObjects or DeleteObject as the model saw it."""

    #: ``time.monotonic()`` when it arrived, before any latency.
    at: float
    #: Keys it named (1 for a DeleteObject).
    keys: int
    #: Keys forwarded upstream to be deleted.
    accepted: int
    #: The SlowDown form it was throttled in, or None.
    form: str | None
    #: Its User-Agent header.
    agent: str


def max_window_keys(arrivals: Iterable[Arrival], window: float) -> int:
    """The most accepted keys among arrivals inside any ``[t, t + window)``."""
    if not window > 0:
        raise ValueError(f"window must be > 0, not {window}")
    ordered = sorted((a for a in arrivals if a.accepted), key=lambda a: a.at)
    best = in_window = start = 0
    for arrival in ordered:
        in_window += arrival.accepted
        while arrival.at - ordered[start].at >= window:
            in_window -= ordered[start].accepted
            start += 1
        best = max(best, in_window)
    return best


def accepted_rate(arrivals: Iterable[Arrival], start: float, end: float) -> float:
    """Accepted keys of the arrivals in ``[start, end)``, per second."""
    if not end > start:
        raise ValueError(f"end must be after start, not {start}..{end}")
    return sum(a.accepted for a in arrivals if start <= a.at < end) / (end - start)


class DeleteRecords:
    """The arrivals and list pages a model saw, safe to read while requests flow.

    ``_lock`` guards the records; the model takes it for its budget too, so that a
    request's verdict and its record are one step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self._list_requests = 0

    def arrivals(self) -> list[Arrival]:
        """A copy of every DeleteObjects and DeleteObject recorded, in arrival order."""
        with self._lock:
            return sorted(self._arrivals, key=lambda a: a.at)

    @property
    def delete_requests(self) -> int:
        """DeleteObjects and DeleteObject requests received, throttled or not."""
        with self._lock:
            return len(self._arrivals)

    @property
    def throttled_requests(self) -> int:
        """Delete requests answered SlowDown, in any form."""
        with self._lock:
            return sum(1 for a in self._arrivals if a.form is not None)

    def throttled_share(self) -> float:
        """Throttled delete requests per delete request; 0.0 before the first."""
        with self._lock:
            total = len(self._arrivals)
            throttled = sum(1 for a in self._arrivals if a.form is not None)
        return throttled / total if total else 0.0

    @property
    def keys_accepted(self) -> int:
        """Keys forwarded upstream to be deleted."""
        with self._lock:
            return sum(a.accepted for a in self._arrivals)

    def throttles_by_form(self) -> collections.Counter[str]:
        """SlowDown form -> how many delete requests were throttled in it."""
        with self._lock:
            return collections.Counter(a.form for a in self._arrivals if a.form is not None)

    @property
    def list_requests(self) -> int:
        """ListObjectsV2 pages served."""
        with self._lock:
            return self._list_requests

    def max_window_keys(self, window: float = 1.0, agent: str | None = None) -> int:
        """The most keys accepted in any ``window`` seconds (see :func:`max_window_keys`).

        With ``agent``, only requests whose User-Agent contains it count.
        """
        return max_window_keys(self._arrivals_of(agent), window)

    def accepted_rate(self, start: float, end: float, agent_contains: str | None = None) -> float:
        """Keys per second accepted from arrivals in ``[start, end)`` (monotonic seconds).

        With ``agent_contains``, only requests whose User-Agent contains it count.
        """
        return accepted_rate(self._arrivals_of(agent_contains), start, end)

    def reset_counters(self) -> None:
        """Forget every record; the budget and the forced throttles stay as they are."""
        with self._lock:
            self._arrivals.clear()
            self._list_requests = 0

    def _arrivals_of(self, agent: str | None) -> list[Arrival]:
        with self._lock:
            return [a for a in self._arrivals if agent is None or agent in a.agent]
