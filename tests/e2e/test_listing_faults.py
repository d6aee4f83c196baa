"""End to end: listings written every valid way still list, delete and verify every expired key.

Real worker processes, a real Redis and ``weed mini``, with the fault proxy
rewriting each ListObjectsV2 answer: control characters as numeric references
(``&#133;``, ``&#x7f;``), keys as from a server that ignores ``encoding-type=url``,
and the continuation token between the objects.  Each weekly folder is longer
than a page, so a reader that loses the token lists a page of each and stops.
"""

from __future__ import annotations

import pytest

from tests.conftest import list_keys, s3_targets, seed_split

pytestmark = pytest.mark.e2e

#: Keys with characters the rewritten listings escape or that HTML decodes its own
#: way (DEL, U+0080 and U+0085 are a euro sign and an ellipsis to HTML), all XML 1.0
#: can carry; they sort first, onto the first page of their folder.
ODD = [
    "a\ttab",
    "a\nline",
    "a\rreturn",
    "a\r\nboth",
    "a\x7fdel",
    "a\x80c1",
    "a\x85next-line",
    "a\x9fapc",
    "a&amp;<lt>\"'",
    "a+plus sp%41ce",
    "a\u00fc\u00f1\u65e5\u672c\U0001f600",
]
WEEKS = ("2026-10-11", "2026-10-18")
#: 1,300 expired keys in each of two weekly folders: two pages each.
EXPIRED = [
    f"statements/{week}/{name}"
    for week in WEEKS
    for name in [*ODD, *(f"cust-{i:06d}.pdf" for i in range(1300 - len(ODD)))]
]
FRESH = [f"statements/2026-11-22/{name}" for name in [*ODD, "cust-000000.pdf"]]
REWRITES = frozenset({"escape_controls", "ignore_encoding", "token_between"})


def test_every_expired_key_is_listed_deleted_and_verified_through_rewritten_listings(
    make_stack, s3, bucket, proxy
):
    # Given 2,600 expired keys (odd characters among them) in two folders of two pages
    # each, 12 fresh ones, and a proxy that rewrites every listing page
    cutoff = seed_split(s3, bucket, EXPIRED, FRESH)
    assert list_keys(s3, bucket) == {*EXPIRED, *FRESH}  # weed stores every one as given
    proxy.listing_rewrites = REWRITES
    stack = make_stack(s3_targets(bucket))
    stack.worker(concurrency=2)

    # When the run is started and waited for
    result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

    # Then every expired key was listed and deleted, and only those
    assert result.code == 0, result
    run = result.json()
    assert run["status"] == "complete"
    assert run["listed"] == len(EXPIRED) + len(FRESH)
    assert run["expired"] == len(EXPIRED)
    assert run["deleted"] == len(EXPIRED)
    assert list_keys(s3, bucket) == set(FRESH)
    assert set(proxy.deleted_key_counts) <= set(EXPIRED)
    assert proxy.faults_injected["listing_rewritten"] >= 2 * len(WEEKS)

    # And verify, listing through the same rewrites, finds nothing expired left
    verify = stack.cli("verify", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert verify.code == 0, verify
    assert verify.json()["remaining_expired"] == 0
