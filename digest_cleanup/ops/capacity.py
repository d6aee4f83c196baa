"""Capacity planning from measured service times: how many delete slots a window needs.

Every batch attempt records its wall time, the time of its delete call and its
key count in the run store (:meth:`~digest_cleanup.store.run_records.RunRecords.timings`).
From those, for ``artifacts`` keys to be deleted within ``window`` seconds:

* per-key service time ``t`` = total attempt seconds / total keys attempted
  (weighted by keys, so a short final batch does not skew it);
* batch service time ``S = t * batch_size``, arrival rate
  ``λ = artifacts / batch_size / window`` batches/s;
* consumers (delete slots: pool processes or threads) =
  ``λ * S / utilization``, rounded up.

With a shared delete budget of ``B`` keys/s (the target's ``delete_rate``), no
run is faster than ``artifacts / B`` seconds, and ``B * t`` slots saturate the
budget: more only wait on it.  The plan says both.

The utilization target leaves headroom for retries, a slow store and the guard
pass, which lists every key before the first delete.  Warnings come with a
plan: a window the budget cannot meet; without a budget, the delete rate the
slots would reach at full speed past S3's documented 3,500 writes per second
per prefix (S3 answers ``SlowDown``); and a p99 batch time too close to the
broker's visibility timeout (past it, Redis hands the batch to a second worker
while the first is still deleting).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Sequence

from digest_cleanup.errors import UsageError
from digest_cleanup.settings import DEFAULT_WORKER_THREADS

#: The utilization a plan aims for unless told otherwise.
DEFAULT_UTILIZATION = 0.6
#: S3's documented request rate per partitioned prefix for PUT/COPY/POST/DELETE.
S3_DELETES_PER_PREFIX = 3500
#: A p99 batch time above this share of the visibility timeout gets a warning.
VISIBILITY_SHARE = 0.25
#: Delete slots one worker process is sized for in the suggested layout: a plain worker's.
DEFAULT_PER_WORKER = DEFAULT_WORKER_THREADS

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


class NoMeasurements(UsageError):
    """The run store holds no batch timings to plan from."""


@dataclasses.dataclass(frozen=True)
class ServiceTimes:
    """Batch attempt times measured in recent runs."""

    attempts: int
    keys: int
    #: Seconds per key, weighted by keys.
    per_key: float
    #: Whole-attempt seconds: median, p95, p99.
    median: float
    p95: float
    p99: float
    #: Median seconds of the delete call alone, and of everything else in an attempt.
    delete_median: float
    overhead_median: float

    @classmethod
    def from_timings(cls, rows: Sequence[tuple[float, float, int]]) -> ServiceTimes:
        """Summarise ``(attempt s, delete s, keys)`` rows; raises :class:`NoMeasurements`."""
        useful = [(a, d, n) for a, d, n in rows if n > 0 and a > 0]
        if not useful:
            raise NoMeasurements(
                "no batch timings in the run store yet; run a cleanup first "
                "(digest-cleanup run TARGET --wait) and plan from its measurements"
            )
        attempts = sorted(a for a, _, _ in useful)
        keys = sum(n for *_, n in useful)
        return cls(
            attempts=len(useful),
            keys=keys,
            per_key=sum(attempts) / keys,
            median=statistics.median(attempts),
            p95=_quantile(attempts, 0.95),
            p99=_quantile(attempts, 0.99),
            delete_median=statistics.median(d for _, d, _ in useful),
            overhead_median=statistics.median(a - d for a, d, _ in useful),
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """Delete slots and workers for a number of artifacts in a window."""

    artifacts: int
    window_seconds: float
    utilization: float
    batch_size: int
    service: ServiceTimes
    batches: int
    #: Seconds one batch of ``batch_size`` keys keeps a slot busy.
    batch_seconds: float
    batches_per_second: float
    deletes_per_second: float
    #: Consumers by the formula, before rounding up.
    consumers_exact: float
    consumers: int
    workers: int
    concurrency: int
    #: Deletes per second the suggested slots reach when they all run flat out.
    peak_deletes_per_second: float
    warnings: list[str]
    #: The shared delete budget in keys/s (0: none), and what it implies: the shortest
    #: a run of ``artifacts`` can take, and the slots and workers that saturate it.
    delete_budget: float = 0.0
    budget_seconds: float | None = None
    saturating_consumers: int | None = None
    saturating_workers: int | None = None

    def as_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["service"] = dataclasses.asdict(self.service)
        return data


def plan(
    artifacts: int,
    window_seconds: float,
    service: ServiceTimes,
    *,
    batch_size: int,
    visibility_timeout: float,
    utilization: float = DEFAULT_UTILIZATION,
    per_worker: int = DEFAULT_PER_WORKER,
    delete_budget: float = 0.0,
) -> Plan:
    """Size the delete slots for ``artifacts`` keys in ``window_seconds``.

    ``delete_budget`` is the shared keys-per-second budget (0: none).
    """
    if artifacts < 1:
        raise UsageError(f"--artifacts: {artifacts} must be at least 1")
    if window_seconds <= 0:
        raise UsageError("--window: must be longer than zero")
    if not 0 < utilization <= 1:
        raise UsageError(f"--utilization: {utilization} must be above 0 and at most 1")
    if batch_size < 1 or per_worker < 1:
        raise UsageError("batch size and slots per worker must be at least 1")
    batches = math.ceil(artifacts / batch_size)
    batch_seconds = service.per_key * batch_size
    rate = batches / window_seconds
    exact = rate * batch_seconds / utilization
    consumers = max(1, math.ceil(exact - 1e-9))
    workers = math.ceil(consumers / per_worker)
    concurrency = math.ceil(consumers / workers)
    peak = workers * concurrency * batch_size / batch_seconds
    needed = artifacts / window_seconds
    warnings = _warnings(needed, peak, service, visibility_timeout, delete_budget)
    saturating = max(1, math.ceil(delete_budget * service.per_key)) if delete_budget else None
    return Plan(
        artifacts=artifacts,
        window_seconds=window_seconds,
        utilization=utilization,
        batch_size=batch_size,
        service=service,
        batches=batches,
        batch_seconds=batch_seconds,
        batches_per_second=rate,
        deletes_per_second=needed,
        consumers_exact=exact,
        consumers=consumers,
        workers=workers,
        concurrency=concurrency,
        peak_deletes_per_second=peak,
        warnings=warnings,
        delete_budget=delete_budget,
        budget_seconds=artifacts / delete_budget if delete_budget else None,
        saturating_consumers=saturating,
        saturating_workers=math.ceil(saturating / per_worker) if saturating else None,
    )


def _warnings(
    needed: float,
    peak: float,
    service: ServiceTimes,
    visibility_timeout: float,
    budget: float,
) -> list[str]:
    """What makes a plan risky: the delete budget or S3's per-prefix rate, and slow batches."""
    warnings = []
    if budget:
        # The budget holds the fleet under it however many slots run: only the window can fail.
        if needed > budget:
            warnings.append(
                f"the window needs {needed:,.0f} deletes/s, past the delete budget of "
                f"{budget:,.0f} keys/s (delete_rate): widen the window, or raise delete_rate "
                "if S3 has partitioned the prefix (ask AWS support), or split the target by "
                "prefix"
            )
    elif needed > S3_DELETES_PER_PREFIX:
        warnings.append(
            f"the window needs {needed:,.0f} deletes/s, past S3's {S3_DELETES_PER_PREFIX:,} "
            "DELETE requests/s per prefix: S3 will answer SlowDown; widen the window or "
            "spread the artifacts over more prefixes"
        )
    elif peak > S3_DELETES_PER_PREFIX:
        warnings.append(
            f"at full speed these slots would send {peak:,.0f} deletes/s, past S3's "
            f"{S3_DELETES_PER_PREFIX:,} per prefix: expect SlowDown retries, or run fewer slots"
        )
    if service.p99 > visibility_timeout * VISIBILITY_SHARE:
        warnings.append(
            f"p99 batch time {service.p99:.1f} s is more than {VISIBILITY_SHARE:.0%} of the "
            f"visibility timeout ({visibility_timeout:.0f} s): a slow batch risks being handed "
            "to a second worker; raise CLEANUP_VISIBILITY_TIMEOUT or lower batch_size"
        )
    return warnings


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``45m``, ``2h``, ``1h30m`` or ``1d``."""
    cleaned = text.strip().lower().replace(" ", "")
    parts = _DURATION_PART.findall(cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise UsageError(
            f"--window: {text!r} is not a duration; use a number with a unit (s, m, h, d), "
            "e.g. 90s, 45m, 2h, 1h30m"
        )
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"--window: {text!r} must be longer than zero")
    return seconds


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
