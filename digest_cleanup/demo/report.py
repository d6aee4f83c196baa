"""The demo's closing report: the run's figures, what verify found, and whether they add up."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from digest_cleanup.demo.artifacts import BATCH_SIZE, OUTSIDE_PREFIX, PREFIX, Seeded
from digest_cleanup.demo.phases import say
from digest_cleanup.demo.servers import s3_client


def count_by_prefix(endpoint: str, bucket: str) -> dict[str, int]:
    """How many objects are left under each top-level prefix of ``bucket``."""
    client = s3_client(endpoint)
    counts: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            top = obj["Key"].split("/", 1)[0] + "/"
            counts[top] = counts.get(top, 0) + 1
    return counts


def _seconds_between(start: str, end: str) -> float:
    """Seconds from one stored ISO time to another."""

    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()


def _run_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's figures as (name, value) rows, with its duration and rate added."""
    duration = _seconds_between(run["created_at"], run.get("ended_at") or run["created_at"])
    rate = run["deleted"] / duration if duration > 0 else 0.0
    return [
        ("status", run["status"]),
        ("cutoff", run["cutoff"]),
        ("listed", f"{run['listed']:,}"),
        ("expired", f"{run['expired']:,}"),
        ("deleted", f"{run['deleted']:,}"),
        ("dead_lettered", f"{run['dead_lettered']:,}"),
        ("batches", f"{run['batches']:,} of up to {BATCH_SIZE:,} keys"),
        ("retries", f"{run['retries']:,}"),
        ("duration", f"{duration:.1f} s"),
        ("keys_per_second", f"{rate:,.0f}"),
        ("report", run.get("report_url") or "-"),
    ]


def report(
    run: dict[str, Any], verify: dict[str, Any], kept: dict[str, int], seeded: Seeded
) -> bool:
    """Print the run report and the verify result; True when everything adds up.

    It adds up when the run completed, deleted exactly the expired statements,
    verify finds none left, and every fresh statement and receipt is still there.
    """
    left_fresh = kept.get(PREFIX, 0)
    left_outside = kept.get(OUTSIDE_PREFIX, 0)
    say()
    say(f"Run {run['run_id']}")
    for name, value in _run_rows(run):
        say(f"  {name:16} {value}")
    say(f"Verify {verify['target']} {verify['location']} before {verify['cutoff']}")
    say(f"  {'remaining':16} {verify['remaining_expired']:,}")
    say(f"  {'fresh_kept':16} {left_fresh:,} of {seeded.fresh:,}")
    say(f"  {'outside_kept':16} {left_outside:,} of {seeded.outside:,}")
    ok = (
        run["status"] == "complete"
        and run["deleted"] == run["expired"] == seeded.expired
        and verify["remaining_expired"] == 0
        and left_fresh == seeded.fresh
        and left_outside == seeded.outside
    )
    say(f"Result: {'OK' if ok else 'MISMATCH: see above'}")
    return ok
