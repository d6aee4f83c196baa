"""The metrics collector over a real run store: what each series says at each stage of a run."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from digest_cleanup.app import create_app
from digest_cleanup.clock import now_iso
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.model.batches import BatchPayload, BatchRecord
from digest_cleanup.model.dead_letters import make_entry
from digest_cleanup.model.run_view import RunView
from digest_cleanup.ops.metrics import RunStateCollector, oldest_pending_age, progress_ratio
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.rig.servers import free_port

TARGETS = """
[targets.statements]
bucket = "digests"
prefix = "statements/"
retention_days = 30
schedule = "0 3 * * 0"

[targets.receipts]
bucket = "digests"
prefix = "receipts/"
retention_days = 30
schedule = "0 3 * * 0"
"""
RUN = "statements-20261023T030000Z"
CUTOFF = "2026-10-23T03:00:00+00:00"


@pytest.fixture
def runtime(redis_url: str, tmp_path: Path) -> Runtime:
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS)
    return Runtime(Settings(broker_url=redis_url, targets_file=path))


def scrape(runtime: Runtime, now: float | None = None) -> dict[tuple[str, frozenset[Any]], float]:
    """One scrape through the real exposition format, as Prometheus reads it."""
    registry = CollectorRegistry(auto_describe=False)
    clock = (lambda: now) if now is not None else time.time
    registry.register(RunStateCollector(runtime, clock=clock))
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def age(samples: dict[tuple[str, frozenset[Any]], float], target: str = "statements") -> float:
    return value(samples, "digest_cleanup_oldest_pending_age_seconds", target=target)


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def open_run(runtime: Runtime, **fields: Any) -> None:
    base = {"target": "statements", "cutoff": CUTOFF, "batch_size": 500, "max_delete": 250000}
    assert runtime.store.runs.open(RUN, base | fields) == "created"


def record(runtime: Runtime, seq: int, **kw: Any) -> str:
    batch = f"{RUN}-b{seq:05d}"
    claim = kw.pop("claim", f"{batch}/g0/a0")
    return runtime.store.runs.record(
        RUN, "statements", BatchRecord(batch_id=batch, claim=claim, **kw)
    )


def checkpoint(runtime: Runtime, seqs: list[int], *, done: bool, expired: int) -> None:
    cp = {"listed": expired, "expired": expired, "seq": max(seqs), "done": done}
    lease = runtime.store.sweeps.take_lease(RUN, 60) or _held_lease(runtime)
    saved = runtime.store.sweeps.save_checkpoint(
        RUN, cp, {f"{RUN}-b{s:05d}": b"" for s in seqs}, lease=lease, lease_seconds=60
    )
    assert saved in ("saved", "finished")


def _held_lease(runtime: Runtime) -> str:
    return bytes(runtime.store.redis.get(runtime.store.run_key(RUN, "sweep_lease"))).decode()


def test_oldest_pending_age_rises_while_listing_then_follows_the_oldest_batch(runtime):
    # Given a run that is still listing
    open_run(runtime)
    created = epoch(runtime.store.runs.get(RUN)["created_at"].replace("Z", "+00:00"))

    # Then its oldest pending item is as old as the run
    assert age(scrape(runtime, created + 120)) == pytest.approx(120)

    # When the sweep has published two batches, a moment apart, and finished
    checkpoint(runtime, [1], done=False, expired=500)
    time.sleep(0.05)
    checkpoint(runtime, [2], done=True, expired=1000)
    (_, first), (_, second) = runtime.store.runs.in_flight(RUN)
    assert first < second

    # Then the age is that of the oldest unfinished batch
    now = second + 300
    assert age(scrape(runtime, now)) == pytest.approx(now - first)

    # When the oldest batch finishes, the next one dates the backlog
    assert record(runtime, 1, deleted=500) == "recorded"
    assert age(scrape(runtime, now)) == pytest.approx(now - second)

    # When the last batch finishes, the run is over and nothing waits
    assert record(runtime, 2, deleted=500) == "finished"
    samples = scrape(runtime, now)
    assert age(samples) == 0
    # and a target that never ran reports nothing waiting either
    assert age(samples, "receipts") == 0


def test_dry_runs_retries_and_streaming_runs_are_judged_as_ops_expect():
    # A dry run deletes nothing, so nothing waits on it.
    dry = RunView(RUN, {"status": "running", "dry_run": "1", "created_at": now_iso()})
    assert oldest_pending_age(dry, [], time.time() + 60) == 0
    # A batch being retried keeps its publish time: the backlog keeps ageing.
    retrying = RunView(RUN, {"status": "running", "sweep_done": "1"})
    assert oldest_pending_age(retrying, [("b1", 1000.0)], 1500.0) == 500.0
    # While streaming, the guard's count is the denominator, not what was listed so far.
    fields = {"status": "running", "expired": "500", "expired_seen": "2000", "deleted": "500"}
    assert progress_ratio(RunView(RUN, fields)) == 0.25


def test_counts_status_and_progress_of_the_latest_run(runtime):
    # Given a finished run with deletes, a dead letter, a skip and a retried batch
    open_run(runtime)
    runtime.store.runs.update(RUN, expired_seen=1000)
    checkpoint(runtime, [1, 2], done=True, expired=1000)
    first = {"deleted": 497, "dead_lettered": 2, "skipped": 1, "codes": {"AccessDenied": 2}}
    assert record(runtime, 1, **first) == "recorded"
    retried = {"retries": 1, "codes": {"SlowDown": 100}, "retried_codes": ["SlowDown"]}
    assert record(runtime, 2, deleted=400, terminal=False, **retried) == "recorded"
    partway = scrape(runtime)
    assert value(partway, "digest_cleanup_run_progress_ratio", target="statements") == 0.9
    assert value(partway, "digest_cleanup_batches", target="statements", state="in_flight") == 1
    assert record(runtime, 2, claim=f"{RUN}-b00002/g0/a1", deleted=100) == "finished"

    # When it is scraped
    samples = scrape(runtime)

    # Then keys by outcome sum to expired, and status, batches and retries agree
    outcomes = {
        o: value(samples, "digest_cleanup_keys_total", target="statements", outcome=o)
        for o in ("deleted", "dead_lettered", "skipped")
    }
    assert outcomes == {"deleted": 997, "dead_lettered": 2, "skipped": 1}
    expired = value(samples, "digest_cleanup_run_expired_keys", target="statements")
    assert sum(outcomes.values()) == expired == 1000
    statuses = {
        s: value(samples, "digest_cleanup_run_status", target="statements", status=s)
        for s in ("running", "complete", "complete_with_failures", "failed")
    }
    assert statuses == {"running": 0, "complete": 0, "complete_with_failures": 1, "failed": 0}
    # A target with no run yet exports every status as 0, so `status="failed"` never flaps.
    assert value(samples, "digest_cleanup_run_status", target="receipts", status="failed") == 0
    assert value(samples, "digest_cleanup_run_progress_ratio", target="statements") == 1
    for state, n in (("published", 2), ("done", 2), ("in_flight", 0)):
        assert value(samples, "digest_cleanup_batches", target="statements", state=state) == n
    # One retried batch attempt, not the 100 keys it carried.
    retries = {
        dict(labels)["code"]: n
        for (name, labels), n in samples.items()
        if name == "digest_cleanup_retries_total"
    }
    assert retries == {"SlowDown": 1}
    assert value(samples, "digest_cleanup_run_info", target="statements", run_id=RUN) == 1


def test_latency_histogram_is_cumulative_per_target(runtime):
    open_run(runtime)
    checkpoint(runtime, [1, 2, 3], done=True, expired=1500)
    for seq, latency in ((1, 0.05), (2, 4.0), (3, 7200.0)):
        record(runtime, seq, deleted=500, latency=latency)

    samples = scrape(runtime)

    name = "digest_cleanup_enqueue_to_ack_seconds"
    buckets = [
        value(samples, f"{name}_bucket", target="statements", le=le)
        for le in ("0.1", "2.5", "5.0", "3600.0", "+Inf")
    ]
    assert buckets == [1, 1, 2, 2, 3]
    assert value(samples, f"{name}_count", target="statements") == 3
    assert value(samples, f"{name}_sum", target="statements") == pytest.approx(7204.05)


def test_dead_letters_last_success_and_verify(runtime):
    # Given two dead-letter entries (3 keys) published as the batch task publishes them
    create_app(runtime=runtime)
    for attempt, keys in enumerate(
        (["statements/a/1.pdf"], ["statements/a/2.pdf", "statements/a/3.pdf"])
    ):
        payload = BatchPayload(
            run_id=RUN,
            target="statements",
            batch_id=f"{RUN}-b00001",
            seq=1,
            cutoff=CUTOFF,
            keys=keys,
            attempt=attempt,
        )
        dead = {k: KeyResult(k, Outcome.PERMANENT, "AccessDenied", "Access Denied") for k in keys}
        runtime.dispatcher.send_dead_letter(make_entry(payload, dead, "permanent_error"))
    # and a target's last success and last verify, as `finish_run` and `verify` write them
    store = runtime.store
    store.redis.set(store.key("target", "statements", "last_success"), "2026-11-22T03:04:05.000Z")
    store.redis.hset(
        store.key("target", "receipts", "verify"),
        mapping={"remaining_expired": "7", "checked_at": "2026-11-22T04:00:00+00:00"},
    )

    samples = scrape(runtime)

    assert value(samples, "digest_cleanup_dead_letter_depth") == 2
    assert value(samples, "digest_cleanup_dead_letter_keys") == 3
    success = "digest_cleanup_last_success_timestamp_seconds"
    assert value(samples, success, target="statements") == epoch("2026-11-22T03:04:05+00:00")
    # Never succeeded: absent rather than 0, so "no success for 8 days" cannot fire on day one.
    assert (success, frozenset({("target", "receipts")})) not in samples
    assert value(samples, "digest_cleanup_expired_remaining", target="receipts") == 7
    verified = value(samples, "digest_cleanup_verify_timestamp_seconds", target="receipts")
    assert verified == epoch("2026-11-22T04:00:00+00:00")
    assert value(samples, "digest_cleanup_redis_up") == 1


def test_unreachable_redis_exports_only_redis_up_zero(tmp_path):
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS)
    runtime = Runtime(Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0", targets_file=path))

    samples = scrape(runtime)

    # Every other series goes absent, which is what the MetricsAbsent alert watches.
    assert samples == {("digest_cleanup_redis_up", frozenset()): 0}


def test_the_delete_budget_series_follow_the_shared_budget(runtime):
    # Given AWS S3 targets (their default budget) and a SlowDown on one of them
    statements = runtime.budget("statements")
    assert statements is not None
    runtime.redis.delete(statements.key)
    statements.reserve(500, max_wait=30)
    statements.throttled()

    # When scraped
    seen = scrape(runtime)

    # Then the throttled target's rate fell below its ceiling; the other's did not
    t = frozenset({("target", "statements")})
    r = frozenset({("target", "receipts")})
    assert seen[("digest_cleanup_delete_budget_keys_per_second", t)] == 3300
    assert seen[("digest_cleanup_delete_rate_keys_per_second", t)] == pytest.approx(3300 * 0.7)
    assert seen[("digest_cleanup_delete_throttles_total", t)] == 1
    assert seen[("digest_cleanup_delete_budget_reserved_keys_total", t)] == 500
    assert seen[("digest_cleanup_delete_rate_keys_per_second", r)] == 3300


def test_a_target_without_a_budget_exports_no_budget_series(redis_url, tmp_path):
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS)
    local = Runtime(
        Settings(broker_url=redis_url, targets_file=path, s3_endpoint_url="http://s3:8333")
    )
    assert not [name for name, _ in scrape(local) if "delete_budget" in name]


def test_a_run_of_a_target_the_file_no_longer_has_shows_no_budget(runtime):
    assert runtime.budget_state("statements") is not None
    assert runtime.budget_state("retired-target") is None


class _StoreClockADayBehind:
    """A kind whose store's clock reads a day earlier than this host's."""

    def server_time(self) -> datetime:
        return datetime.now(UTC) - timedelta(days=1)


def test_a_wide_clock_skew_is_exported_for_its_target_and_ages_out(runtime):
    # Given a retention check that saw the store's clock a day behind this host's
    from digest_cleanup.pipeline.trusted_clock import (
        SKEW_REPORT_SECONDS,
        recorded_skews,
        trusted_now,
    )

    now = trusted_now(runtime.store, _StoreClockADayBehind(), target="statements")  # type: ignore[arg-type]

    # Then the check used the earliest clock, and a scrape shows the skew for that target
    # only, until it is older than the reporting window
    assert now < datetime.now(UTC) - timedelta(hours=23)
    series = scrape(runtime)
    skew = series[("digest_cleanup_clock_skew_seconds", frozenset({("target", "statements")}))]
    assert 86_300 < skew < 86_500
    assert series[("digest_cleanup_clock_skew_seconds", frozenset({("target", "receipts")}))] == 0
    later = time.time() + SKEW_REPORT_SECONDS + 60
    assert recorded_skews(runtime.store, now=later) == {}
