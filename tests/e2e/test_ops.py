"""Operations on the real stack: the metrics endpoint during a 20k-key run, and JSON log lines."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from http.client import HTTPConnection
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from digest_cleanup.demo.seed import digest_layout_keys, seed_keys
from tests.conftest import s3_targets
from tests.rig.servers import free_port
from tests.rig.stack import Process, Stack, wait_for

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

KEYS = digest_layout_keys("statements/", 20_000, "2026-10-18")
#: One refused key in each of three batches: three dead-letter entries.
DENIED = {KEYS[7], KEYS[10_007], KEYS[19_999]}
OUTCOMES = ("deleted", "dead_lettered", "skipped")


def parse(text: str) -> Samples:
    """Prometheus text (or JSON from ``metrics --json``) as ``{(name, labels): value}``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def parse_json(data: dict[str, Any]) -> Samples:
    return {
        (s["name"], frozenset(s["labels"].items())): s["value"]
        for family in data.values()
        for s in family["samples"]
    }


def http_request(
    port: int, path: str, method: str = "GET", body: bytes | None = None, **headers: str
) -> tuple[int, str]:
    """One request to a server on the loopback; returns the status and the body."""
    connection = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def scrape(port: int) -> Samples:
    status, text = http_request(port, "/metrics")
    assert status == 200, text
    return parse(text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def of_target(samples: Samples, name: str, **labels: str) -> float:
    """A series of the ``statements`` target, the only one these tests configure."""
    return value(samples, f"digest_cleanup_{name}", target="statements", **labels)


def start_metrics(stack: Stack) -> int:
    """Start ``digest-cleanup metrics`` on a free port and wait until it answers."""
    port = free_port()
    argv = [stack.executable("digest-cleanup"), "metrics", "--port", str(port)]
    proc = stack.start("metrics", argv)

    def answers() -> bool:
        if not proc.alive():
            raise AssertionError(f"metrics exited:\n{proc.output()}")
        try:
            return ("digest_cleanup_redis_up", frozenset()) in scrape(port)
        except OSError:
            return False

    wait_for(answers, 60, "the metrics endpoint to answer")
    return port


def test_metrics_follow_a_20k_key_run_from_first_listing_to_the_last_delete(
    make_stack, weed, bucket, proxy
):
    # Given 20,000 expired keys, three of which S3 refuses to delete, behind a slow S3
    seed_keys(weed.endpoint_url, bucket, KEYS)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) >= cutoff, 5, "the clock to pass the cutoff")
    proxy.deny_keys = DENIED
    proxy.delay = 0.1
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=2)
    port = start_metrics(stack)

    # When a run starts and Prometheus scrapes the endpoint until the run ends
    started = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert started.code == 0, started
    run_id = started.json()["run_id"]
    scrapes: list[Samples] = []

    def run_ended() -> bool:
        samples = scrape(port)
        scrapes.append(samples)
        assert of_target(samples, "run_info", run_id=run_id) == 1
        return of_target(samples, "run_status", status="running") == 0

    wait_for(run_ended, 300, "the run to end", interval=0.5)
    final = scrape(port)

    # Then the oldest pending age rose while the run worked and fell to 0 at its end
    ages = [of_target(s, "oldest_pending_age_seconds") for s in scrapes]
    peak = ages.index(max(ages))
    assert max(ages) > 2, ages
    assert any(0 < ages[i] < ages[peak] for i in range(peak)), ages
    assert of_target(final, "oldest_pending_age_seconds") == 0
    # and progress was visible part way
    ratios = [of_target(s, "run_progress_ratio") for s in scrapes]
    assert any(0 < r < 1 for r in ratios), ratios
    assert of_target(final, "run_progress_ratio") == 1

    # And keys by outcome sum to the run's expired count
    status = stack.cli("status", run_id, "--json").json()
    outcomes = {o: of_target(final, "keys_total", outcome=o) for o in OUTCOMES}
    assert outcomes == {o: status[o] for o in OUTCOMES}
    assert sum(outcomes.values()) == status["expired"] == 20_000
    assert outcomes["dead_lettered"] == 3

    # And the dead-letter depth matches what `dlq list` shows
    listing = stack.cli("dlq", "list", "--json").json()
    assert value(final, "digest_cleanup_dead_letter_depth") == listing["depth"] == 3
    listed_keys = sum(e["key_count"] for e in listing["entries"])
    assert value(final, "digest_cleanup_dead_letter_keys") == listed_keys == 3

    # And batches, status and latency tell the same story
    for state, n in (("published", 40), ("done", 40), ("in_flight", 0)):
        assert of_target(final, "batches", state=state) == n
    assert of_target(final, "run_status", status="complete_with_failures") == 1
    assert of_target(final, "enqueue_to_ack_seconds_count") >= 40
    # A run with dead letters is not a success.
    assert not any(name == "digest_cleanup_last_success_timestamp_seconds" for name, _ in final)

    # And `metrics --json` prints the same snapshot once
    once = stack.cli("metrics", "--json")
    assert once.code == 0, once
    snapshot = parse_json(once.json())
    for name in ("digest_cleanup_dead_letter_depth", "digest_cleanup_dead_letter_keys"):
        assert value(snapshot, name) == value(final, name)
    assert of_target(snapshot, "keys_total", outcome="deleted") == 19_997


def _json_worker(stack: Stack) -> Process:
    """A worker without Celery's banner, which is printed outside logging."""
    argv = [
        stack.executable("celery"),
        "-A",
        "digest_cleanup",
        "--quiet",
        "worker",
        "--loglevel=INFO",
        "--concurrency=2",
        "--hostname=json@%h",
        "--without-mingle",
        "--without-gossip",
    ]
    # Tests run as root; Celery warns about that on stderr before logging is set up.
    env = {"PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges"}
    return stack.start("worker", argv, env).wait_ready()


def test_worker_logs_are_json_lines_with_one_event_per_batch_and_run_transition(
    make_stack, weed, bucket, proxy
):
    # Given a worker logging JSON, and a run with a throttled S3 and one refused key
    keys = KEYS[:1200]
    seed_keys(weed.endpoint_url, bucket, keys)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) >= cutoff, 5, "the clock to pass the cutoff")
    proxy.deny_keys = {keys[5]}
    proxy.slowdown_rate = 0.6
    proxy.retry_after = 0
    env = {"CLEANUP_LOG_FORMAT": "json", "CLEANUP_LOG_HASH_SEGMENT": "2"}
    stack = make_stack(s3_targets(bucket), env={**env, "CLEANUP_MAX_RETRIES": "30"})
    worker = _json_worker(stack)

    # When the run ends and the worker is stopped
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    assert result.code == 1, result
    run = result.json()
    assert worker.terminate() == 0

    # Then every line of its log is one JSON object (but the shutdown notice that Celery's
    # signal handler prints to stdout, where log records never go: they are on stderr)
    notices = {"worker: Warm shutdown (MainProcess)"}
    lines = [line for line in worker.output().splitlines() if line.strip() not in {"", *notices}]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    assert all({"ts", "level", "logger"} <= r.keys() for r in records)
    # Celery's own lines are JSON too
    received = re.compile(r"Task digest_cleanup\.delete_batch\[.+\] received")
    assert any(received.match(r.get("message", "")) for r in records)

    # And each batch outcome is one event with the run, the batch, its counts and duration
    batches = [r for r in records if r.get("event") == "batch"]
    assert {r["batch_id"] for r in batches} == {f"{run['run_id']}-b{n:05d}" for n in (1, 2, 3)}
    assert all(r["run_id"] == run["run_id"] and r["duration"] >= 0 for r in batches)
    assert sum(r.get("deleted", 0) for r in batches) == 1199
    assert sum(r.get("dead_lettered", 0) for r in batches) == 1
    retrying = [r for r in batches if r["status"] == "retrying"]
    assert retrying, "the throttled S3 made no batch retry"
    assert all(r["retrying"] > 0 for r in retrying)
    # and each run transition too: the guard pass, the end of the listing, the end of the run
    assert [r["expired"] for r in records if r.get("event") == "guard"] == [1200]
    assert [r["batches"] for r in records if r.get("event") == "sweep"] == [3]
    (end,) = [r for r in records if r.get("event") == "run"]
    assert (end["run_id"], end["status"], end["deleted"], end["dead_lettered"]) == (
        run["run_id"],
        "complete_with_failures",
        1199,
        1,
    )
    assert end["duration"] > 0
    # No key reaches the log in clear.
    assert "cust-" not in worker.output()
