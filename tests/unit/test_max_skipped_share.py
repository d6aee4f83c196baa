"""``max_skipped_share``: how much of a run its target may skip and still end complete."""

from __future__ import annotations

import pytest

from digest_cleanup.errors import TargetsFileError
from digest_cleanup.targets import DEFAULT_MAX_SKIPPED_SHARE, parse_target

BASE = {"bucket": "b", "prefix": "p/", "retention_days": 7, "schedule": "0 3 * * 0"}


def test_a_target_without_it_allows_a_tenth() -> None:
    assert DEFAULT_MAX_SKIPPED_SHARE == 0.1
    assert parse_target("statements", BASE).max_skipped_share == 0.1


@pytest.mark.parametrize("value", [0, 0.25, 1])
def test_any_share_from_none_to_all_is_accepted(value: float) -> None:
    target = parse_target("statements", {**BASE, "max_skipped_share": value})
    assert target.max_skipped_share == value
    assert isinstance(target.max_skipped_share, float)


@pytest.mark.parametrize("value", [-0.1, 1.5, "10%", True, float("nan")])
def test_a_bad_share_is_refused_naming_the_target_and_the_field(value: object) -> None:
    with pytest.raises(TargetsFileError) as err:
        parse_target("statements", {**BASE, "max_skipped_share": value})
    message = str(err.value)
    assert "targets.statements.max_skipped_share" in message
    assert "0 and 1" in message
