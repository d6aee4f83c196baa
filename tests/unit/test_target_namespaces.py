"""Which keys a target covers: folder prefixes, and tables as namespaces."""

from __future__ import annotations

import pytest

from digest_cleanup.errors import TargetsFileError
from digest_cleanup.targets import parse_targets


def _s3(name: str, prefix: str, *extra: str) -> str:
    return (
        "\n".join(
            [
                f"[targets.{name}]",
                'bucket = "bkt"',
                f'prefix = "{prefix}"',
                "retention_days = 30",
                'schedule = "0 3 * * 0"',
                *extra,
            ]
        )
        + "\n"
    )


def _pg(name: str, table: str, retention: int, *extra: str) -> str:
    return (
        "\n".join(
            [
                f"[targets.{name}]",
                'kind = "postgres"',
                f'table = "{table}"',
                'primary_key = "id"',
                'timestamp_column = "created_at"',
                f"retention_days = {retention}",
                'schedule = "0 3 * * 0"',
                *extra,
            ]
        )
        + "\n"
    )


def test_a_prefix_without_a_trailing_slash_is_refused_naming_the_fix():
    # Given a prefix that also matches sibling folders (statements-archive/, statements2/)
    # When the file loads
    with pytest.raises(TargetsFileError) as err:
        parse_targets(_s3("statements", "statements"))

    # Then it is refused, naming the field, the setting and both fixes
    message = str(err.value)
    assert message.startswith("targets.statements.prefix:")
    assert "add a trailing slash" in message
    assert "prefix_is_folder = false" in message
    assert "every key that starts with 'statements'" in message


def test_prefix_is_folder_false_accepts_a_raw_prefix_which_overlaps_its_siblings():
    # Given a raw prefix asked for by name
    raw = _s3("statements", "statements", "prefix_is_folder = false")
    assert parse_targets(raw).get("statements").options.prefix == "statements"

    # Then a target on a sibling folder it also matches is refused as overlapping
    with pytest.raises(TargetsFileError, match=r"targets\.statements and targets\.archive overlap"):
        parse_targets(raw + _s3("archive", "statements-archive/"))


def test_prefix_is_folder_must_be_a_boolean():
    with pytest.raises(TargetsFileError, match="prefix_is_folder"):
        parse_targets(_s3("statements", "statements", 'prefix_is_folder = "no"'))


def test_sibling_folders_whose_names_share_a_start_do_not_overlap():
    text = _s3("a", "data/a/") + _s3("ab", "data/ab/")

    assert sorted(parse_targets(text).by_name) == ["a", "ab"]


@pytest.mark.parametrize("second", ["events", "public.events"])
def test_two_postgres_targets_on_one_table_are_refused_naming_both(second):
    # Given two targets on one table with different retention (unqualified means public)
    text = _pg("events", "events", 30) + _pg("events_long", second, 365)

    # When the file loads, then it is refused as an overlap, as two S3 prefixes are
    with pytest.raises(TargetsFileError) as err:
        parse_targets(text)

    assert "targets.events and targets.events_long overlap" in str(err.value)
    assert 'overlaps = ["events_long"]' in str(err.value)


def test_postgres_tables_whose_names_share_a_start_do_not_overlap():
    text = (
        _pg("events", "events", 30)
        + _pg("archive", "events_archive", 365)
        + _pg("other_schema", "audit.events", 365)
    )

    assert sorted(parse_targets(text).by_name) == ["archive", "events", "other_schema"]


def test_an_intended_overlap_of_two_postgres_targets_loads():
    text = _pg("events", "events", 30, 'overlaps = ["again"]') + _pg("again", "events", 30)

    assert parse_targets(text).get("events").overlaps == ("again",)
