"""A PostgreSQL ``date`` column expires at the end of its day, never inside retention."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from digest_cleanup.kinds.base import Outcome
from digest_cleanup.kinds.postgres import PostgresKind
from digest_cleanup.kinds.postgres_options import PostgresOptions
from digest_cleanup.settings import Settings

pytest_plugins = ["tests.postgres_fixture"]

#: One row per day around the cutoff's day, keyed by its date.
DAYS = ["2026-10-23", "2026-10-24", "2026-10-25", "2026-10-26"]


@pytest.fixture
def dated(
    postgres_dsn: str,
) -> Iterator[tuple[str, PostgresKind, psycopg.Connection[tuple[object, ...]]]]:
    """A table with a ``date`` timestamp column, one row per day of :data:`DAYS`."""
    name = f"receipts_{secrets.token_hex(4)}"
    ident = sql.Identifier(name)
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE TABLE {t} (k text PRIMARY KEY, sent_on date)").format(t=ident)
        )
        for day in DAYS:
            admin.execute(sql.SQL("INSERT INTO {t} VALUES (%s, %s)").format(t=ident), [day, day])
        options = PostgresOptions(table=name, primary_key="k", timestamp_column="sent_on")
        kind = PostgresKind(
            "receipts", options, Settings(env={"CLEANUP_POSTGRES_DSN": postgres_dsn})
        )
        try:
            yield name, kind, admin
        finally:
            kind.close()
            admin.execute(sql.SQL("DROP TABLE {t}").format(t=ident))


def _left(admin: psycopg.Connection[tuple[object, ...]], name: str) -> list[str]:
    rows = admin.execute(sql.SQL("SELECT k FROM {t} ORDER BY k").format(t=sql.Identifier(name)))
    return [str(r[0]) for r in rows.fetchall()]


@pytest.mark.parametrize(
    ("cutoff", "expired"),
    [
        # 03:00 on the 25th: the 24th ended at 00:00 and has expired, the 25th has not
        (datetime(2026, 10, 25, 3, 0, tzinfo=UTC), ["2026-10-23", "2026-10-24"]),
        # a minute before midnight: the 24th is not over yet
        (datetime(2026, 10, 24, 23, 59, tzinfo=UTC), ["2026-10-23"]),
        # exactly midnight: the 24th just ended
        (datetime(2026, 10, 25, 0, 0, tzinfo=UTC), ["2026-10-23", "2026-10-24"]),
    ],
    ids=["mid-morning", "before-midnight", "at-midnight"],
)
def test_a_row_dated_d_expires_only_once_d_plus_one_midnight_is_at_or_before_the_cutoff(
    dated, cutoff, expired
):
    name, kind, admin = dated

    # When the table is scanned at the cutoff
    listed = [key for page in kind.scan(cutoff) for key in page.expired]

    # Then only the days that ended by the cutoff are expired, and the count agrees
    assert listed == expired
    assert kind.remaining(cutoff) == len(expired)

    # and a delete naming every row, as a forged batch would, removes only those
    results = {r.key: r.outcome for r in kind.delete(DAYS, cutoff)}
    assert {k for k, o in results.items() if o is Outcome.DELETED} == set(expired)
    assert _left(admin, name) == [d for d in DAYS if d not in expired]
