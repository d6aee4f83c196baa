"""Scopes, retention and conditions: the checks that stand before any delete."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.errors import CutoffError, PoisonMessage, TargetsFileError
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.model.dead_letters import make_poison_entry
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets


def _target(name: str, bucket: str, prefix: str, *extra: str) -> str:
    lines = [
        f"[targets.{name}]",
        f'bucket = "{bucket}"',
        f'prefix = "{prefix}"',
        "retention_days = 30",
        'schedule = "0 3 * * 0"',
        *extra,
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("statements/", "statements/eu/"),
        ("statements/eu/", "statements/"),
        ("statements", "statements-archive/"),
    ],
)
def test_targets_whose_prefixes_nest_are_refused_naming_both(first, second):
    # A prefix without its trailing slash has to be asked for as a raw prefix.
    raw = () if first.endswith("/") else ("prefix_is_folder = false",)
    text = _target("a", "bkt", first, *raw) + _target("b", "bkt", second)

    with pytest.raises(TargetsFileError, match=r"targets\.a and targets\.b overlap") as err:
        parse_targets(text)

    assert 'overlaps = ["b"]' in str(err.value)


def test_a_whole_bucket_target_overlaps_every_other_target_in_its_bucket():
    text = _target("everything", "bkt", "", "allow_whole_bucket = true") + _target(
        "tmp", "bkt", "tmp/"
    )

    with pytest.raises(TargetsFileError, match="overlap"):
        parse_targets(text)


def test_disjoint_prefixes_and_other_buckets_load():
    text = (
        _target("statements", "bkt", "statements/")
        + _target("tmp", "bkt", "tmp/")
        + _target("other", "another-bucket", "statements/")
    )

    assert sorted(parse_targets(text).by_name) == ["other", "statements", "tmp"]


def test_an_overlap_declared_on_either_side_loads():
    text = _target("a", "bkt", "statements/", 'overlaps = ["b"]') + _target(
        "b", "bkt", "statements/eu/"
    )

    assert parse_targets(text).get("a").overlaps == ("b",)


@pytest.mark.parametrize(
    ("audit_url", "refused"),
    [
        ("s3://bkt/statements/audit/", True),
        ("s3://bkt/", True),
        ("s3://bkt/reports/", False),
        ("s3://audit-bucket/statements/", False),
    ],
)
def test_an_audit_location_inside_a_target_is_refused(audit_url, refused):
    text = _target("statements", "bkt", "statements/")

    if refused:
        with pytest.raises(TargetsFileError, match=r"CLEANUP_AUDIT_URL.*targets\.statements"):
            parse_targets(text, audit_url=audit_url)
    else:
        assert len(parse_targets(text, audit_url=audit_url)) == 1


def test_a_cutoff_inside_the_retention_window_is_refused_with_the_latest_allowed():
    target = parse_targets(_target("statements", "bkt", "statements/")).get("statements")
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    latest = now - timedelta(days=30)

    target.check_cutoff(latest, now)  # the edge itself is allowed
    with pytest.raises(CutoffError) as err:
        target.check_cutoff(latest + timedelta(seconds=1), now)

    assert "retention_days = 30" in str(err.value)
    assert latest.isoformat() in str(err.value)


def test_the_scope_digest_follows_what_a_delete_does_and_nothing_else():
    settings = Settings(s3_endpoint_url="http://127.0.0.1:1")

    def digest(**options: object) -> str:
        base = {"bucket": "bkt", "prefix": "statements/"}
        return S3Kind("t", S3Options(**{**base, **options}), settings).scope_digest  # type: ignore[arg-type]

    assert digest() == digest()
    assert digest() != digest(prefix="statements/eu/")
    assert digest() != digest(bucket="other")
    assert digest() != digest(versions="all")
    # a worker that would drop the listed ETags deletes differently: another scope
    assert digest() != digest(conditional_deletes=False)
    # another URL for the same store (a relay, a VPC endpoint) is the same scope
    elsewhere = Settings(s3_endpoint_url="http://127.0.0.1:2")
    assert digest() == S3Kind("t", S3Options("bkt", "statements/"), elsewhere).scope_digest


def _payload(**changes: object) -> BatchPayload:
    base = BatchPayload(
        run_id="r",
        target="t",
        batch_id="r-b00001",
        seq=1,
        cutoff="2026-11-01T00:00:00+00:00",
        keys=["statements/a.pdf", "statements/b.pdf", "statements/c.pdf"],
        conditions=['"ea"', '"eb"', '"ec"'],
        scope="abc",
    )
    return BatchPayload(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_conditions_and_scope_travel_with_the_message():
    payload = _payload()

    decoded = BatchPayload.from_message(payload.to_message())

    assert decoded == payload


def test_a_subset_keeps_each_item_with_its_own_condition():
    payload = _payload()

    subset = payload.subset(["statements/c.pdf", "statements/a.pdf"], attempt=2)

    assert subset.keys == ["statements/c.pdf", "statements/a.pdf"]
    assert subset.conditions == ['"ec"', '"ea"']
    assert subset.attempt == 2
    assert _payload(conditions=[]).subset(["statements/b.pdf"]).conditions == []


def test_a_message_whose_conditions_do_not_match_its_keys_is_poison():
    raw = _payload().to_message()
    raw["conditions"] = ['"ea"']

    with pytest.raises(PoisonMessage, match="1 conditions for 3 keys"):
        BatchPayload.from_message(raw)


def test_a_poison_entry_keeps_every_key_of_a_batch_sized_message():
    # Given a message that does not decode (1,001 keys: more than a batch takes)
    # whose keys are as long as S3 allows
    rest = [f"{i:04d}".ljust(1000, "x") for i in range(1001)]

    # When it becomes a poison entry
    entry = make_poison_entry("t1", {"base": "statements/", "rest": rest}, "too_many_keys", "")

    # Then every key is kept, as a genuine batch's would be
    assert entry.body["dead_letter"]["item_count"] == 1001
    assert len(entry.body["dead_letter"]["items"]) == 1001
    assert entry.body["dead_letter"]["items"][-1].startswith("statements/1000")


def test_a_forged_message_larger_than_any_batch_is_counted_not_stored_whole():
    many = ["x" * 1024] * 5000
    oversized = ["y" * 100_000] * 1000

    entry = make_poison_entry("t2", {"base": "", "rest": many}, "too_many_keys", "")
    huge = make_poison_entry("t3", {"base": "k/", "rest": oversized}, "malformed", "")

    # Key-sized items are kept up to twice the largest batch; longer ones are no keys at
    # all, and only a few are shown, clipped
    assert entry.body["dead_letter"]["item_count"] == 5000
    assert 1000 < len(entry.body["dead_letter"]["items"]) < 5000
    assert huge.body["dead_letter"]["item_count"] == 1000
    assert len(huge.body["dead_letter"]["items"]) == 50
