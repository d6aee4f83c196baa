"""Prometheus metrics, read from the run store on every scrape.

:class:`RunStateCollector` keeps no state of its own: each scrape reads Redis, so
any number of ``digest-cleanup metrics`` processes may run, and one that restarts
loses nothing.  Series labelled ``target`` describe the *latest run* of each
target in the targets file (``dc:target:T:latest``); the ``_total`` counters
among them start again from 0 when a new run begins, which ``rate()`` reads as
a counter reset.  The names used by ``deploy/prometheus/alerts.yml`` are fixed.

It is long because every series the endpoint exports is defined here, with its
help text, so one module answers "what does the endpoint export?".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from digest_cleanup.clock import epoch_of
from digest_cleanup.model.run_view import RunView
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.trusted_clock import recorded_skews
from digest_cleanup.store.budget import BudgetState
from digest_cleanup.store.run_records import LATENCY_BUCKETS
from digest_cleanup.targets import DEFAULT_MAX_SKIPPED_SHARE

logger = logging.getLogger("digest_cleanup.metrics")

#: Every run status, each exported (1 for the current one, 0 for the others) so
#: that an alert can match ``status="failed"`` without the series coming and going.
STATUSES = ("running", "complete", "complete_with_failures", "failed")
#: What can happen to an expired key; at the end of a run these sum to ``expired``.
OUTCOMES = ("deleted", "dead_lettered", "skipped")


@dataclasses.dataclass(frozen=True)
class TargetScrape:
    """What one scrape read about one target."""

    target: str
    run: RunView | None
    #: Batches in flight with their publish time, oldest first (running runs only).
    pending: Sequence[tuple[str, float]] = ()
    retried_codes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    latency: Mapping[str, str] = dataclasses.field(default_factory=dict)
    last_success: str | None = None
    verify: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The target's shared delete budget, or None when it has none.
    budget: BudgetState | None = None
    #: The latest run's failing keys by error code (the report's ``failures_by_code``).
    failure_codes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: The share of expired keys the latest run may skip and still be complete (the
    #: target's configured one while it has no run).
    max_skipped_share: float = DEFAULT_MAX_SKIPPED_SHARE


def oldest_pending_age(
    run: RunView | None, pending: Sequence[tuple[str, float]], now: float
) -> float:
    """Seconds the oldest expired key a running run has found has waited for deletion.

    While the sweep lists, keys found so far have waited at most since the run
    was created; after the sweep, the oldest published batch not yet finished
    dates them.  A finished run (or a dry run, which deletes nothing) has none.
    """
    if run is None or run.status != "running" or run.fields.get("dry_run") == "1":
        return 0.0
    if run.fields.get("sweep_done") != "1":
        created = epoch_of(run.fields.get("created_at"))
        return max(now - created, 0.0) if created is not None else 0.0
    return max(now - min(score for _, score in pending), 0.0) if pending else 0.0


def progress_ratio(run: RunView | None) -> float:
    """Share of the run's expired keys that reached an outcome, 0 to 1.

    While the sweep streams, ``expired`` only counts what it has listed so far,
    so the guard pass's count (``expired_seen``) is the better denominator.
    """
    if run is None:
        return 0.0
    if run.fields.get("dry_run") == "1":
        return 1.0 if run.finished else 0.0
    done = sum(run.count(o) for o in OUTCOMES)
    total = run.count("expired")
    if run.fields.get("sweep_done") != "1":
        total = max(total, run.count("expired_seen"))
    if total:
        return min(done / total, 1.0)
    return 1.0 if run.finished and run.status != "failed" else 0.0


class RunStateCollector:
    """A Prometheus collector that reads every value from Redis when scraped."""

    def __init__(self, runtime: Runtime, clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.clock = clock

    def describe(self) -> list[Metric]:
        # Nothing to announce ahead: registering must not need Redis.
        return []

    def collect(self) -> Iterator[Metric]:
        """Every metric family, or only ``digest_cleanup_redis_up 0`` when Redis fails."""
        try:
            families = self.families()
        except redis.RedisError as exc:
            logger.warning("metrics: cannot read the run store: %s", exc)
            families = []
        up = GaugeMetricFamily(
            "digest_cleanup_redis_up",
            "1 when this scrape could read the run store in Redis, else 0 (and nothing else "
            "is exported, so every other digest_cleanup series goes absent)",
            value=1 if families else 0,
        )
        yield from families
        yield up

    def families(self) -> list[Metric]:
        """Read the run store once and build every family; raises on a Redis error."""

        now = self.clock()
        states = [self._read(t.name) for t in self.runtime.targets]
        depth, keys, oldest = self.runtime.dead_letters.stats()
        settings = self.runtime.settings
        fams = _Families()
        fams.gauge(
            "digest_cleanup_dead_letter_depth",
            "Entries in the dead-letter queue (each a batch's failed keys), as "
            "`digest-cleanup dlq list` counts them; nothing consumes this queue",
        ).add_metric([], depth)
        fams.gauge(
            "digest_cleanup_dead_letter_keys",
            "Keys waiting in the dead-letter queue for an operator (redrive or purge)",
        ).add_metric([], keys)
        fams.gauge(
            "digest_cleanup_dead_letter_oldest_age_seconds",
            "Seconds the oldest dead-letter entry has waited (0 when the queue is empty)",
        ).add_metric([], max(0.0, now - oldest) if oldest is not None else 0.0)
        fams.gauge(
            "digest_cleanup_dead_letter_max_entries",
            "CLEANUP_DLQ_MAX_ENTRIES: past it an alert fires; no entry is ever dropped",
        ).add_metric([], settings.dlq_max_entries)
        fams.gauge(
            "digest_cleanup_dead_letter_retention_seconds",
            "CLEANUP_DLQ_RETENTION_DAYS in seconds: an entry older than it raises an alert",
        ).add_metric([], settings.dlq_retention_days * 86_400)
        for state in states:
            _add_target(fams, state, now)
        skews = recorded_skews(self.runtime.store)
        skew = fams.gauge(
            "digest_cleanup_clock_skew_seconds",
            "Seconds between the earliest and latest of a worker's, Redis's and the store's "
            "clocks, when over 120 s in the last 15 minutes (else 0); retention checks use "
            "the earliest",
            labels=["target"],
        )
        for state in states:
            skew.add_metric([state.target], skews.get(state.target, 0.0))
        return fams.all()

    def _read(self, target: str) -> TargetScrape:
        store = self.runtime.store
        run_id = store.runs.latest(target)
        run = store.runs.find(run_id) if run_id else None
        pending: list[tuple[str, float]] = []
        retried: dict[str, int] = {}
        failures: dict[str, int] = {}
        share = self.runtime.targets.get(target).max_skipped_share
        if run is not None:
            retried = store.runs.retried_codes(run.run_id)
            failures = store.runs.retry_codes(run.run_id)
            # A run opened before the field existed is held to the default (see finish.lua).
            share = float(run.fields.get("max_skipped_share") or DEFAULT_MAX_SKIPPED_SHARE)
            if run.status == "running":
                pending = store.runs.in_flight(run.run_id)
        return TargetScrape(
            target=target,
            run=run,
            pending=pending,
            retried_codes=retried,
            latency=store.runs.latency(target),
            last_success=store.targets.last_success(target),
            verify=store.targets.last_verify(target),
            budget=self.runtime.budget_state(target),
            failure_codes=failures,
            max_skipped_share=share,
        )


class _Families:
    """The metric families of one scrape, created in a fixed order on first use."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        family = self._by_name.setdefault(name, GaugeMetricFamily(name, doc, labels=labels))
        assert isinstance(family, GaugeMetricFamily)
        return family

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
        family = self._by_name.setdefault(name, CounterMetricFamily(name, doc, labels=labels))
        assert isinstance(family, CounterMetricFamily)
        return family

    def histogram(self, name: str, doc: str, labels: Sequence[str]) -> HistogramMetricFamily:
        family = self._by_name.setdefault(name, HistogramMetricFamily(name, doc, labels=labels))
        assert isinstance(family, HistogramMetricFamily)
        return family

    def all(self) -> list[Metric]:
        return list(self._by_name.values())


def _add_target(fams: _Families, state: TargetScrape, now: float) -> None:
    """Add one target's series; the families exist (empty) even with no run yet."""
    _add_run_state(fams, state, now)
    _add_run_counts(fams, state)
    _add_failures(fams, state)
    _add_history(fams, state)
    _add_budget(fams, state.target, state.budget)


#: The budget's series: (name, kind, help, BudgetState field).
_BUDGET_SERIES = (
    ("delete_budget_keys_per_second", "gauge", "The target's delete_rate ceiling", "ceiling"),
    ("delete_rate_keys_per_second", "gauge",
     "The shared delete rate now: the ceiling, lowered while S3 answers SlowDown", "rate"),
    ("delete_budget_paused_seconds", "gauge",
     "Seconds the budget stays paused for a Retry-After, or 0", "paused_for"),
    ("delete_budget_reserved_keys", "counter",
     "Keys the workers drew from the budget; rate() of it is the fleet's delete rate",
     "reserved_keys"),
    ("delete_throttles", "counter",
     "Delete requests S3 throttled (SlowDown in any form), as the workers reported them",
     "throttles"),
    ("delete_budget_wait_seconds", "counter",
     "Seconds batches were told to wait for the budget before sending", "wait_seconds"),
    ("delete_budget_deferred", "counter",
     "Batches handed back because their budget was further off than they may wait",
     "deferred"),
)  # fmt: skip


def _add_budget(fams: _Families, target: str, budget: BudgetState | None) -> None:
    """The target's shared delete budget (see :mod:`digest_cleanup.store.budget`); a
    target without one adds no series, but the families exist."""
    for name, kind, doc, field in _BUDGET_SERIES:
        family = (fams.gauge if kind == "gauge" else fams.counter)(
            f"digest_cleanup_{name}", doc, ["target"]
        )
        if budget is not None:
            family.add_metric([target], getattr(budget, field))


def _add_run_state(fams: _Families, state: TargetScrape, now: float) -> None:
    """Where the target's latest run stands: its oldest pending key, status and progress."""
    t, run = [state.target], state.run
    fams.gauge(
        "digest_cleanup_oldest_pending_age_seconds",
        "Age of the oldest expired artifact the running run has found and not yet "
        "deleted (0 when no run is running): the SLO is 2 hours",
        ["target"],
    ).add_metric(t, oldest_pending_age(run, state.pending, now))
    status = fams.gauge(
        "digest_cleanup_run_status",
        "1 for the status of the target's latest run, 0 for the other statuses",
        ["target", "status"],
    )
    for name in STATUSES:
        status.add_metric([*t, name], 1 if run is not None and run.status == name else 0)
    fams.gauge(
        "digest_cleanup_max_skipped_share",
        "Share of its expired keys the latest run may skip and still end complete "
        "(the target's max_skipped_share when the run opened)",
        ["target"],
    ).add_metric(t, state.max_skipped_share)
    fams.gauge(
        "digest_cleanup_run_progress_ratio",
        "Share of the latest run's expired keys that reached an outcome (0 to 1)",
        ["target"],
    ).add_metric(t, progress_ratio(run))


def _add_run_counts(fams: _Families, state: TargetScrape) -> None:
    """The latest run's counters."""
    t, run = [state.target], state.run
    keys = fams.counter(
        "digest_cleanup_keys",
        "Expired keys of the latest run by outcome; deleted + dead_lettered + skipped "
        "equals expired once the run ends (a redrive moves keys out of dead_lettered)",
        ["target", "outcome"],
    )
    batches = fams.gauge(
        "digest_cleanup_batches",
        "Batches of the latest run: published by the sweep, done, and in flight",
        ["target", "state"],
    )
    expired = fams.gauge(
        "digest_cleanup_run_expired_keys",
        "Expired keys the latest run has found so far (final once its sweep is done)",
        ["target"],
    )
    duplicates = fams.counter(
        "digest_cleanup_duplicate_deliveries",
        "Batch deliveries of the latest run that were duplicates (counted once, deleted "
        "harmlessly again)",
        ["target"],
    )
    redriven = fams.counter(
        "digest_cleanup_redriven",
        "Dead-lettered keys of the latest run moved back onto the work queue by `dlq redrive`",
        ["target"],
    )
    retries = fams.counter(
        "digest_cleanup_retries",
        "Batch attempts of the latest run that scheduled a retry, by the error code of "
        "the retried keys",
        ["target", "code"],
    )
    info = fams.gauge(
        "digest_cleanup_run_info", "The id of the target's latest run", ["target", "run_id"]
    )
    started = fams.gauge(
        "digest_cleanup_run_started_timestamp_seconds",
        "When the target's latest run was created (Unix time)",
        ["target"],
    )
    if run is not None:
        for outcome in OUTCOMES:
            keys.add_metric([*t, outcome], run.count(outcome))
        batches.add_metric([*t, "published"], run.count("batches"))
        batches.add_metric([*t, "done"], run.count("batches_done"))
        batches.add_metric([*t, "in_flight"], run.count("inflight"))
        expired.add_metric(t, run.count("expired"))
        duplicates.add_metric(t, run.count("duplicates"))
        redriven.add_metric(t, run.count("redriven"))
        for code, n in sorted(state.retried_codes.items()):
            retries.add_metric([*t, code], n)
        info.add_metric([*t, run.run_id], 1)
        created = epoch_of(run.fields.get("created_at"))
        if created is not None:
            started.add_metric(t, created)


def _add_failures(fams: _Families, state: TargetScrape) -> None:
    """The latest run's failing keys by code, which the endpoint and dead-letter alerts read."""
    failures = fams.counter(
        "digest_cleanup_key_failures",
        "Failing keys of the latest run by error code, once per attempt, retried or "
        "dead-lettered: the report's failures_by_code",
        ["target", "code"],
    )
    for code, n in sorted(state.failure_codes.items()):
        failures.add_metric([state.target, code], n)


def _add_history(fams: _Families, state: TargetScrape) -> None:
    """Across runs: the last success, the last verify, and batch latency."""
    t = [state.target]
    success = fams.gauge(
        "digest_cleanup_last_success_timestamp_seconds",
        "When a run of the target last ended complete (Unix time); absent until one has",
        ["target"],
    )
    when = epoch_of(state.last_success)
    if when is not None:
        success.add_metric(t, when)
    remaining = fams.gauge(
        "digest_cleanup_expired_remaining",
        "Expired keys still present at the target's last `digest-cleanup verify`",
        ["target"],
    )
    verified = fams.gauge(
        "digest_cleanup_verify_timestamp_seconds",
        "When `digest-cleanup verify` last checked the target (Unix time)",
        ["target"],
    )
    if "remaining_expired" in state.verify:
        remaining.add_metric(t, int(state.verify["remaining_expired"]))
        checked = epoch_of(state.verify.get("checked_at"))
        if checked is not None:
            verified.add_metric(t, checked)
    fams.histogram(
        "digest_cleanup_enqueue_to_ack_seconds",
        "Seconds from a batch attempt's publish to its acknowledgement, every run of the target",
        ["target"],
    ).add_metric(t, *_buckets(state.latency))


def _buckets(raw: Mapping[str, str]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets and the sum from the run store's per-bucket counts."""
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound in LATENCY_BUCKETS:
        cumulative += int(raw.get(str(bound), 0))
        buckets.append((str(float(bound)), cumulative))
    buckets.append(("+Inf", int(raw.get("count", 0))))
    return buckets, float(raw.get("sum", 0.0))


def snapshot(metrics: Iterable[Metric]) -> dict[str, Any]:
    """Metric families as JSON-able data, for ``digest-cleanup metrics --json``."""
    return {
        m.name: {
            "type": m.type,
            "help": m.documentation,
            "samples": [
                {"name": s.name, "labels": dict(s.labels), "value": s.value} for s in m.samples
            ],
        }
        for m in metrics
    }
