"""Key-range sharding of a prefix without sub-prefixes, on an in-memory ListObjectsV2.

The real server is exercised in ``tests/integration/test_s3_shards.py``; here many
generated key sets check the properties that matter: every key exactly once,
cursors that resume exactly, ranges that share the work, and a bounded number
of requests spent finding them.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from digest_cleanup.kinds import s3_ranges, s3_shards

MODIFIED = datetime(2026, 10, 18, tzinfo=UTC)


class FakeS3:
    """ListObjectsV2 over sorted keys: Prefix, StartAfter, MaxKeys and continuation."""

    def __init__(self, keys: list[str]) -> None:
        # S3 orders keys by their UTF-8 bytes, which is code point order.
        self.keys = sorted(set(keys))
        self.requests: list[dict[str, Any]] = []

    def list_objects_v2(self, **params: Any) -> dict[str, Any]:
        self.requests.append(params)
        prefix = params.get("Prefix", "")
        after = params.get("ContinuationToken") or params.get("StartAfter") or ""
        size = params.get("MaxKeys", 1000)
        at = bisect.bisect_right(self.keys, after)
        found: list[str] = []
        while at < len(self.keys) and len(found) <= size:
            key = self.keys[at]
            if key.startswith(prefix):
                found.append(key)
            elif key > prefix and not key.startswith(prefix):
                break
            at += 1
        page, more = found[:size], len(found) > size
        response: dict[str, Any] = {
            "Contents": [{"Key": k, "LastModified": MODIFIED} for k in page],
            "IsTruncated": more,
        }
        if more:
            response["NextContinuationToken"] = page[-1]
        return response

    def get_paginator(self, name: str) -> FakeS3:
        assert name == "list_objects_v2"
        return self

    def paginate(self, **params: Any) -> Iterator[dict[str, Any]]:
        while True:
            response = self.list_objects_v2(**params)
            yield response
            if not response["IsTruncated"]:
                return
            params = {**params, "ContinuationToken": response["NextContinuationToken"]}


def scan(client: FakeS3, prefix: str, start_after: str | None = None, page_size: int = 1000):
    return list(s3_shards.pages(client, "bucket", prefix, start_after, page_size))


def keys_of(pages: list[tuple[list[dict[str, Any]], str]]) -> list[str]:
    return [o["Key"] for contents, _ in pages for o in contents]


def weekly(count: int, week: str = "2026-10-18") -> list[str]:
    return [f"statements/{week}/cust-{i:07d}.pdf" for i in range(count)]


def range_sizes(keys: list[str], bounds: list[str]) -> list[int]:
    edges = [bisect.bisect_right(keys, b) for b in bounds]
    return [b - a for a, b in zip([0, *edges], [*edges, len(keys)], strict=True)]


def test_one_weekly_folder_is_cut_into_ranges_that_share_the_work():
    keys = weekly(120_000)
    client = FakeS3(keys)

    bounds = s3_ranges.split(client, "bucket", "statements/", keys[999], s3_shards.LIST_SHARDS)

    assert len(client.requests) <= s3_ranges.SPLIT_PROBES
    assert len(bounds) == s3_shards.LIST_SHARDS - 1
    sizes = range_sizes(keys[1000:], bounds)
    assert sum(sizes) == len(keys) - 1000
    # No range holds more than half the keys, so 2 or more streams run at once.
    assert max(sizes) <= len(keys) // 2, sizes


def test_hashed_keys_are_cut_evenly():
    rng = random.Random(7)
    keys = sorted(f"receipts/{rng.getrandbits(64):016x}.json" for _ in range(20_000))
    client = FakeS3(keys)

    bounds = s3_ranges.split(client, "bucket", "receipts/", keys[999], s3_shards.LIST_SHARDS)

    sizes = range_sizes(keys[1000:], bounds)
    assert len(sizes) == s3_shards.LIST_SHARDS
    assert max(sizes) < 1.5 * (len(keys) - 1000) / len(sizes), sizes


def test_a_flat_prefix_is_listed_in_ranges_every_key_once():
    keys = weekly(5_000)
    client = FakeS3(keys)

    pages = scan(client, "statements/", page_size=100)

    assert Counter(keys_of(pages)) == Counter(keys)
    assert all(cursor.startswith(s3_shards.MARK) for _, cursor in pages)
    assert s3_shards.ShardCursor.decode(pages[-1][1]).bounds[0] == keys[99]


def test_a_prefix_of_one_page_is_listed_plainly():
    keys = weekly(80)
    client = FakeS3(keys)

    pages = scan(client, "statements/", page_size=100)

    assert pages == [([{"Key": k, "LastModified": MODIFIED} for k in keys], keys[-1])]
    assert len(client.requests) == 2  # the delimited look for sub-prefixes, then the page


def _random_keys(rng: random.Random) -> list[str]:
    # ASCII, 2-, 3- and 4-byte UTF-8, and the code point the range bounds end with
    alphabet = "09az-_./é€𝄞" + s3_ranges.TOP
    stems = ["p/", "p/a", "p/a/b", "p/zz", "p/é", "p/0-"]
    count = rng.randint(0, 600)
    return [
        rng.choice(stems) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("seed", range(40))
def test_any_key_set_is_listed_exactly_and_resumes_exactly_after_any_page(seed):
    rng = random.Random(seed)
    outside = ["o/1", "p", "q/1"]  # around the prefix, never listed
    keys = sorted(set(_random_keys(rng)) - {"p/"})
    client = FakeS3(keys + outside)

    pages = scan(client, "p/", page_size=rng.choice([1, 3, 17, 50, 1000]))

    assert Counter(keys_of(pages)) == Counter(keys)
    for i in rng.sample(range(len(pages)), min(len(pages), 8)):
        given = keys_of(pages[: i + 1])
        rest = keys_of(scan(client, "p/", start_after=pages[i][1], page_size=7))
        assert Counter(given + rest) == Counter(keys), f"resuming after page {i}"


def test_finding_the_ranges_stops_at_its_request_budget():
    # Keys whose every character position branches widely: the groups never run out.
    keys = [f"p/{a}{b}{c}" for a in "abcdefghij" for b in "abcdefghij" for c in "abcdefghij"]
    client = FakeS3(keys)

    bounds = s3_ranges.split(client, "bucket", "p/", keys[0], 4)

    assert len(client.requests) <= s3_ranges.SPLIT_PROBES
    assert bounds == sorted(bounds)
    assert all(b > keys[0] for b in bounds)
    assert sum(range_sizes(keys[1:], bounds)) == len(keys) - 1


def test_a_range_ends_at_its_bound_inclusive_when_a_key_equals_it():
    # Given a resumed range listing whose bounds are real keys
    keys = [f"p/{i:04d}" for i in range(1000)]
    client = FakeS3(keys)
    bounds = [keys[9], keys[300], keys[301], keys[700]]
    cursor = s3_shards.ShardCursor(direct=True, bounds=bounds).encode()

    # Then every key after the first bound comes exactly once, each bound key included
    pages = scan(client, "p/", start_after=cursor, page_size=64)

    assert Counter(keys_of(pages)) == Counter(keys[10:])


def test_split_aims_for_four_character_groups_per_listing_stream():
    assert s3_ranges.SPLIT_GROUPS == 4 * s3_shards.LIST_SHARDS
