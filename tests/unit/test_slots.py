"""A target's last slot (croniter) is the fire time that Celery's crontab, beat's, agrees on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from celery.schedules import crontab

from digest_cleanup.errors import TargetsFileError
from digest_cleanup.targets import SLOT_SEARCH, Target, parse_targets

#: The schedules the project's examples and deployments use, and some that test the
#: corners: ranges, steps, names, a range across the week's end, and both day fields.
SCHEDULES = (
    "0 3 * * 0",
    "0 3 * * 1",
    "30 3 * * 0",
    "0 4 * * *",
    "0 4 * * 0",
    "0 5 * * 0",
    "*/15 3-5 * * mon-fri",
    "0 22-2 * * fri-mon",
    "45 23 * * sat,sun",
    "0 3 */10 * *",
    "0 0 1 */3 *",
    "0 3 1 * 1",
    "0 3 13 * 5",
)
#: Times to ask at: exactly at a fire time of several schedules, just before and after
#: one, a leap day, a year's end, and the start of a month.
TIMES = (
    datetime(2026, 11, 30, 3, 0, tzinfo=UTC),
    datetime(2026, 11, 30, 3, 0, 30, tzinfo=UTC),
    datetime(2026, 11, 30, 2, 59, 59, tzinfo=UTC),
    datetime(2026, 11, 29, 3, 0, tzinfo=UTC),
    datetime(2026, 11, 29, 23, 45, tzinfo=UTC),
    datetime(2026, 6, 1, 3, 0, tzinfo=UTC),
    datetime(2028, 2, 29, 12, 34, 56, tzinfo=UTC),
    datetime(2027, 1, 1, 0, 0, tzinfo=UTC),
    datetime(2026, 3, 1, 0, 0, 1, tzinfo=UTC),
)


def _target(schedule: str) -> Target:
    text = (
        f'[targets.t]\nbucket = "b"\nprefix = "p/"\nretention_days = 1\nschedule = "{schedule}"\n'
    )
    return parse_targets(text).get("t")


def _celery_next(schedule: crontab, after: datetime) -> datetime:
    """The first fire time after ``after`` by Celery's own scheduling arithmetic."""
    last, delta, _ = schedule.remaining_delta(after, tz=UTC)
    return last + delta  # type: ignore[no-any-return]


def _celery_slot(schedule: crontab, now: datetime) -> datetime | None:
    """The latest minute at or before ``now`` that Celery's crontab fields all match."""
    t = now.replace(second=0, microsecond=0)
    while now - t < SLOT_SEARCH:
        if (
            t.minute in schedule.minute
            and t.hour in schedule.hour
            and t.day in schedule.day_of_month
            and t.month in schedule.month_of_year
            and t.isoweekday() % 7 in schedule.day_of_week
        ):
            return t
        t -= timedelta(minutes=1)
    return None


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("now", TIMES, ids=lambda t: t.isoformat())
def test_the_last_slot_is_celerys_latest_fire_time(schedule: str, now: datetime) -> None:
    # Given a target on a schedule, and the same schedule as Celery's crontab
    target = _target(schedule)
    celery = target.crontab()

    # When its last slot is asked for
    expected = _celery_slot(celery, now)
    if expected is None:
        with pytest.raises(TargetsFileError, match="no slot in the last 35 days"):
            target.last_slot(now)
        return
    slot = target.last_slot(now)

    # Then it is the minute Celery's fields match, Celery fires at it, and Celery
    # fires next only after now: no fire time lies between the slot and now
    assert slot == expected
    assert slot.utcoffset() == timedelta(0)
    assert _celery_next(celery, slot - timedelta(minutes=1)) == slot
    assert _celery_next(celery, slot) > now


def test_a_fire_time_is_its_own_slot() -> None:
    # Given Mondays 03:00 UTC (Celery and croniter both number Sunday 0 and Monday 1)
    target = _target("0 3 * * 1")

    # Then exactly at a fire time, and within its minute, the slot is that instant
    monday = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
    assert target.last_slot(monday) == monday
    assert target.last_slot(monday + timedelta(seconds=59)) == monday
    assert target.last_slot(monday - timedelta(seconds=1)) == monday - timedelta(weeks=1)


def test_a_slot_older_than_the_search_is_an_error() -> None:
    # Given a yearly schedule
    target = _target("0 3 1 1 *")

    # Then its slot is found up to 35 days on, and not a minute later
    new_year = datetime(2027, 1, 1, 3, 0, tzinfo=UTC)
    assert target.last_slot(new_year + SLOT_SEARCH - timedelta(minutes=1)) == new_year
    with pytest.raises(TargetsFileError, match="no slot in the last 35 days"):
        target.last_slot(new_year + SLOT_SEARCH)


def test_a_slot_is_read_in_utc_whatever_the_zone_of_now() -> None:
    # Given Sundays 03:00 UTC, and a time given in New York's winter zone
    target = _target("0 3 * * 0")
    new_york = datetime(2026, 11, 28, 22, 30, tzinfo=timezone(timedelta(hours=-5)))

    # Then the slot is Sunday 03:00 UTC (Saturday 22:00 there), not a Saturday's
    assert target.last_slot(new_york) == datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
