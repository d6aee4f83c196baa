"""Sharded listing on a real S3 server: every key exactly once, and cursors that resume exactly."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from digest_cleanup.clock import utcnow
from digest_cleanup.demo.seed import create_bucket, seed_keys
from digest_cleanup.errors import TransientError
from digest_cleanup.kinds import s3_shards
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import sweep_slice
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing.dispatcher import recording
from tests.rig.stack import wait_for

#: Four weekly folders (one nested deeper) and keys directly under the prefix.
KEYS = sorted(
    [f"statements/2026-10-{day:02d}/cust-{i:05d}.pdf" for day in (4, 11, 18) for i in range(1200)]
    + [f"statements/2026-10-25/eu/cust-{i:05d}.pdf" for i in range(50)]
    + ["statements/0-readme.txt", "statements/2026-10-11.manifest", "statements/zz-last.pdf"]
)
OUTSIDE = ["receipts/2026-10-04/r-1.json", "statementsX/not-under-the-prefix.pdf"]
FUTURE = datetime.now(UTC) + timedelta(days=1)


@pytest.fixture(scope="module")
def sharded_bucket(weed):
    name = f"shards-{uuid.uuid4().hex[:8]}"
    create_bucket(weed.endpoint_url, name)
    seed_keys(weed.endpoint_url, name, KEYS + OUTSIDE)
    # A run's cutoff may not lie ahead of the clock: wait for one that is after every key.
    seeded = datetime.now(UTC) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) > seeded, 5, "the clock to pass the seeding")
    return name


def make_kind(weed: Any, bucket: str, prefix: str = "statements/") -> S3Kind:
    settings = Settings(
        s3_endpoint_url=weed.endpoint_url, aws_access_key_id="k", aws_secret_access_key="s"
    )
    return S3Kind("statements", S3Options(bucket=bucket, prefix=prefix), settings)


@pytest.fixture
def kind(weed, sharded_bucket):
    return make_kind(weed, sharded_bucket)


def scanned(kind: S3Kind, start_after: str | None = None) -> list[str]:
    return [key for page in kind.scan(FUTURE, start_after=start_after) for key in page.expired]


def test_a_sharded_scan_gives_every_key_exactly_once(kind):
    # Given a prefix with several sub-prefixes and direct keys (so the listing is sharded)
    assert s3_shards.segments(kind.client, kind.options.bucket, "statements/", 1000) is not None

    # When it is scanned
    pages = list(kind.scan(FUTURE))

    # Then every key under the prefix comes once, and each page has a sharded cursor
    keys = [k for page in pages for k in page.expired]
    assert sorted(keys) == KEYS
    assert len(keys) == len(set(keys))
    assert all(page.cursor and page.cursor.startswith(s3_shards.MARK) for page in pages)


def test_resuming_after_any_page_gives_exactly_the_rest(kind):
    # Given the pages, and the cursor a sweep would checkpoint after each
    pages = list(kind.scan(FUTURE))

    for i in range(0, len(pages), 2):
        # When a scan resumes after page i
        given = [k for page in pages[: i + 1] for k in page.expired]
        rest = scanned(kind, start_after=pages[i].cursor)

        # Then the two together are every key, none twice
        assert Counter(given + rest) == Counter(KEYS), f"resuming after page {i}"


def test_a_sub_prefix_emptied_between_slices_is_not_missed_or_repeated(weed, s3):
    # Given a sharded scan interrupted after its first pages
    bucket = f"shards-{uuid.uuid4().hex[:8]}"
    create_bucket(weed.endpoint_url, bucket)
    seed_keys(weed.endpoint_url, bucket, KEYS)
    kind = make_kind(weed, bucket)
    listing = kind.scan(FUTURE)
    first = [next(listing) for _ in range(3)]
    listing.close()
    given = [k for page in first for k in page.expired]

    # When a whole weekly folder is deleted meanwhile (workers deleting during the publish pass)
    gone = [k for k in KEYS if k.startswith("statements/2026-10-18/")]
    for i in range(0, len(gone), 1000):
        s3.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in gone[i : i + 1000]]}
        )

    # Then resuming gives every remaining key not given yet, once
    rest = scanned(kind, start_after=first[-1].cursor)
    assert Counter(given + rest) == Counter(set(KEYS) - set(gone) | set(given))


def test_a_plain_key_cursor_continues_a_plain_listing(kind, s3):
    # Given a cursor of a listing that started plain (a checkpoint from before sharding)
    cursor = "statements/2026-10-11/cust-00599.pdf"

    # Then the scan continues it plainly, in the server's own order
    expected = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=kind.options.bucket, Prefix="statements/", StartAfter=cursor
        )
        for o in page.get("Contents", [])
    ]
    assert scanned(kind, start_after=cursor) == expected
    assert len(expected) < len(KEYS)


def test_dropping_a_scan_midway_stops_its_listing_threads(kind):
    # Given a scan that is dropped after two pages (a sweep slice out of time)
    before = threading.active_count()
    listing = kind.scan(FUTURE)
    next(listing)
    next(listing)
    assert threading.active_count() > before

    # When it is closed
    listing.close()

    # Then its threads end soon after
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before


def test_a_listing_error_in_one_sub_prefix_reaches_the_scan(kind):
    # Given S3 fails every listing of one weekly folder with 503
    def fail(request: Any, **_: Any) -> AWSResponse | None:
        if "2026-10-11%2F" in request.url:
            return AWSResponse(request.url, 503, {}, _Raw(b"<Error><Code>SlowDown</Code></Error>"))
        return None

    kind.client.meta.events.register("before-send.s3.ListObjectsV2", fail)

    # Then the scan raises the pipeline's transient error, as a plain listing would
    with pytest.raises(TransientError):
        scanned(kind)


def test_a_prefix_without_sub_prefixes_is_listed_in_key_ranges(weed, bucket):
    # Given one folder of 3,500 keys (no sub-prefixes to shard by)
    flat = [f"flat/cust-{i:05d}.pdf" for i in range(3500)]
    seed_keys(weed.endpoint_url, bucket, flat)
    kind = make_kind(weed, bucket, "flat/")
    assert s3_shards.segments(kind.client, bucket, "flat/", 1000) is None

    # When it is scanned
    pages = list(kind.scan(FUTURE))

    # Then after its first page it is listed as several key ranges, every key once
    assert [k for page in pages for k in page.expired][:1000] == flat[:1000]
    assert Counter(k for page in pages for k in page.expired) == Counter(flat)
    state = s3_shards.ShardCursor.decode(pages[-1].cursor or "")
    assert state.bounds[0] == flat[999]
    assert len(state.bounds) == s3_shards.LIST_SHARDS
    # and resuming after any page gives exactly the rest
    for i in range(len(pages)):
        given = [k for page in pages[: i + 1] for k in page.expired]
        assert Counter(given + scanned(kind, pages[i].cursor)) == Counter(flat), i


def test_a_prefix_of_one_page_is_listed_plainly(weed, bucket):
    few = [f"few/cust-{i:05d}.pdf" for i in range(600)]
    seed_keys(weed.endpoint_url, bucket, few)
    kind = make_kind(weed, bucket, "few/")

    pages = list(kind.scan(FUTURE))

    assert [k for page in pages for k in page.expired] == few
    assert [page.cursor for page in pages] == [few[-1]]


def test_a_sweep_sliced_page_by_page_publishes_every_key_once(weed, sharded_bucket, redis_url):
    # Given a run over the sharded prefix, swept one page per slice (a checkpoint each)
    targets = parse_targets(
        f'[targets.statements]\nbucket = "{sharded_bucket}"\nprefix = "statements/"\n'
        'retention_days = 0\nschedule = "0 3 * * 0"\nbatch_size = 700\n'
    )
    settings = Settings(
        broker_url=redis_url,
        s3_endpoint_url=weed.endpoint_url,
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )
    runtime = Runtime(settings, targets)
    cutoff = utcnow()
    run_id = start(recording(runtime), runtime.target("statements"), cutoff).run_id
    sent: list[BatchPayload] = []

    # When slices run until the sweep is done
    results = []
    while not results or results[-1] == "continue":
        results.append(sweep_slice(recording(runtime, sent.append), run_id, slice_seconds=1e-9))

    # Then every expired key went out in exactly one batch, and the run agrees
    assert results[-1] == "done"
    assert results.count("continue") > 5  # the listing spanned many slices
    assert Counter(k for p in sent for k in p.keys) == Counter(KEYS)
    run = runtime.store.runs.get(run_id)
    assert (run.count("listed"), run.count("expired")) == (len(KEYS), len(KEYS))
    runtime.close()


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body
