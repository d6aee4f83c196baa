"""The postgres kind against a real PostgreSQL server (see ``postgres_fixture``)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from digest_cleanup.errors import PermanentError, SettingsError, TargetsFileError, TransientError
from digest_cleanup.kinds.base import Outcome
from digest_cleanup.kinds.postgres import PostgresKind
from digest_cleanup.kinds.postgres_errors import classify
from digest_cleanup.kinds.postgres_options import PostgresOptions
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets

ROWS = 5000
#: Every fifth row is fresh, the other four fifths are a month old.
FRESH_EVERY = 5

# The same name the conftest registers, so pytest loads the fixtures once either way.
pytest_plugins = ["tests.postgres_fixture"]

MakeKind = Callable[..., PostgresKind]


@pytest.fixture
def cutoff() -> datetime:
    return datetime.now(UTC) - timedelta(days=7)


@pytest.fixture
def admin(postgres_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def table(admin: psycopg.Connection[tuple[object, ...]]) -> Iterator[str]:
    """A table of 5,000 rows keyed by bigint: 4,000 expired, 1,000 fresh (every fifth id)."""
    name = f"snapshots_{secrets.token_hex(4)}"
    admin.execute(
        sql.SQL(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, customer text,"
            " updated_at timestamptz NOT NULL)"
        ).format(t=sql.Identifier(name))
    )
    admin.execute(
        sql.SQL(
            "INSERT INTO {t} SELECT g, 'customer-' || g, CASE WHEN g %% %s = 0 THEN now()"
            " ELSE now() - interval '30 days' END FROM generate_series(1, %s) AS g"
        ).format(t=sql.Identifier(name)),
        [FRESH_EVERY, ROWS],
    )
    yield name
    admin.execute(sql.SQL("DROP TABLE {t}").format(t=sql.Identifier(name)))


@pytest.fixture
def make_kind(postgres_dsn: str) -> Iterator[MakeKind]:
    """Build kinds on the session database (or another DSN); all are closed afterwards."""
    made: list[PostgresKind] = []

    def make(table: str, *, dsn: str = postgres_dsn, **fields: str) -> PostgresKind:
        options = PostgresOptions(
            table=table,
            primary_key=fields.pop("primary_key", "id"),
            timestamp_column=fields.pop("timestamp_column", "updated_at"),
        )
        kind = PostgresKind("snapshots", options, Settings(env={"CLEANUP_POSTGRES_DSN": dsn}))
        made.append(kind)
        return kind

    yield make
    for kind in made:
        kind.close()


def expired_ids(low: int = 1, high: int = ROWS) -> list[str]:
    return [str(i) for i in range(low, high + 1) if i % FRESH_EVERY]


def count(admin: psycopg.Connection[tuple[object, ...]], table: str, where: str = "true") -> int:
    query = sql.SQL("SELECT count(*) FROM {t} WHERE ").format(t=sql.Identifier(table))
    row = admin.execute(query + sql.SQL(where)).fetchone()
    assert row is not None
    return int(row[0])


def test_scan_pages_cover_every_expired_key_once_in_key_order(
    table: str, make_kind: MakeKind, cutoff: datetime
) -> None:
    # Given 5,000 rows, 4,000 of them expired
    kind = make_kind(table)
    # When the whole table is scanned
    pages = list(kind.scan(cutoff))
    # Then every expired key comes exactly once, in key order, and every row is counted
    assert [key for page in pages for key in page.expired] == expired_ids()
    assert sum(page.scanned for page in pages) == ROWS
    assert len(pages) == ROWS // kind.scan_page_size
    assert [page.cursor for page in pages] == [str(n) for n in range(1000, ROWS + 1, 1000)]


def test_scan_resumes_right_after_start_after(
    table: str, make_kind: MakeKind, cutoff: datetime
) -> None:
    # Given a full scan of the table
    kind = make_kind(table)
    pages = list(kind.scan(cutoff))
    # When a scan resumes from the second page's cursor, or from an arbitrary key
    resumed = list(kind.scan(cutoff, start_after=pages[1].cursor))
    from_key = list(kind.scan(cutoff, start_after="2500"))
    # Then it continues exactly where that page ended
    assert resumed == pages[2:]
    assert [key for page in from_key for key in page.expired] == expired_ids(2501)
    assert sum(page.scanned for page in from_key) == ROWS - 2500


def test_delete_removes_exactly_the_expired_rows_of_a_batch(
    table: str, make_kind: MakeKind, admin: psycopg.Connection[tuple[object, ...]], cutoff: datetime
) -> None:
    # Given a batch of the first 1,000 keys: 800 expired, 200 fresh
    kind = make_kind(table)
    batch = [str(i) for i in range(1, 1001)]
    # When it is deleted
    results = kind.delete(batch, cutoff)
    # Then the expired rows are gone, the fresh ones are skipped and kept
    assert [r.key for r in results] == batch
    deleted = {r.key for r in results if r.outcome is Outcome.DELETED}
    skipped = {r.key for r in results if r.outcome is Outcome.SKIPPED}
    assert deleted == set(expired_ids(1, 1000))
    assert skipped == set(batch) - deleted
    assert count(admin, table, "id <= 1000") == 200
    assert count(admin, table) == ROWS - 800
    assert kind.remaining(cutoff) == 3200


def test_row_updated_after_the_scan_is_skipped_and_kept(
    table: str, make_kind: MakeKind, admin: psycopg.Connection[tuple[object, ...]], cutoff: datetime
) -> None:
    # Given a batch from a scan, and one of its rows rewritten afterwards
    kind = make_kind(table)
    batch = next(kind.scan(cutoff)).expired[:10]
    admin.execute(
        sql.SQL("UPDATE {t} SET updated_at = now() WHERE id = %s").format(t=sql.Identifier(table)),
        [int(batch[3])],
    )
    # When the batch is deleted
    results = kind.delete(batch, cutoff)
    # Then that row is skipped as no longer expired and still exists
    skipped = [r for r in results if r.outcome is Outcome.SKIPPED]
    assert [(r.key, r.code) for r in skipped] == [(batch[3], "changed_since_listing")]
    assert all(r.outcome is Outcome.DELETED for r in results if r.key != batch[3])
    assert count(admin, table, f"id = {int(batch[3])}") == 1


def test_deleting_the_same_batch_twice_is_deleted_both_times(
    table: str, make_kind: MakeKind, admin: psycopg.Connection[tuple[object, ...]], cutoff: datetime
) -> None:
    # Given a batch of expired keys
    kind = make_kind(table)
    batch = expired_ids(1, 50)
    # When it is deleted twice (a redelivered message)
    first = kind.delete(batch, cutoff)
    second = kind.delete(batch, cutoff)
    # Then both report every item deleted, and the rows are gone
    assert [r.outcome for r in first] == [Outcome.DELETED] * len(batch)
    assert [r.outcome for r in second] == [Outcome.DELETED] * len(batch)
    assert count(admin, table, "id <= 50") == 10


def test_role_without_delete_privilege_gets_permanent_permission_denied(
    table: str,
    make_kind: MakeKind,
    admin: psycopg.Connection[tuple[object, ...]],
    postgres_dsn: str,
    cutoff: datetime,
) -> None:
    # Given a role that may only SELECT from the table
    role, password = f"dc_reader_{secrets.token_hex(4)}", secrets.token_hex(8)
    admin.execute(
        sql.SQL("CREATE ROLE {r} LOGIN PASSWORD {p}").format(
            r=sql.Identifier(role), p=sql.Literal(password)
        )
    )
    admin.execute(
        sql.SQL("GRANT SELECT ON {t} TO {r}").format(
            t=sql.Identifier(table), r=sql.Identifier(role)
        )
    )
    try:
        kind = make_kind(table, dsn=make_conninfo(postgres_dsn, user=role, password=password))
        batch = next(kind.scan(cutoff)).expired[:5]
        # When it deletes a batch
        results = kind.delete(batch, cutoff)
        kind.close()
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {r}").format(r=sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {r}").format(r=sql.Identifier(role)))
    # Then every item fails permanently as permission_denied, and nothing is deleted
    assert {(r.outcome, r.code) for r in results} == {(Outcome.PERMANENT, "permission_denied")}
    assert count(admin, table) == ROWS


def test_row_locked_by_another_transaction_gives_transient_lock_timeout(
    table: str,
    make_kind: MakeKind,
    admin: psycopg.Connection[tuple[object, ...]],
    postgres_dsn: str,
    cutoff: datetime,
) -> None:
    # Given one row of the batch locked by another open transaction, and a short lock_timeout
    kind = make_kind(table)
    kind.lock_timeout = "200ms"
    batch = expired_ids(1, 20)
    with psycopg.connect(postgres_dsn) as locker:
        locker.execute(
            sql.SQL("SELECT 1 FROM {t} WHERE id = %s FOR UPDATE").format(t=sql.Identifier(table)),
            [int(batch[7])],
        )
        # When the batch is deleted
        results = kind.delete(batch, cutoff)
        # Then every item is transient lock_timeout and the batch deleted nothing
        assert {(r.outcome, r.code) for r in results} == {(Outcome.TRANSIENT, "lock_timeout")}
        assert count(admin, table, "id <= 20") == 20
        locker.rollback()
    # And once the lock is released, the retry deletes the batch on the same kind
    assert {r.outcome for r in kind.delete(batch, cutoff)} == {Outcome.DELETED}
    assert count(admin, table, "id <= 20") == 4


@pytest.mark.parametrize(
    ("key_type", "ts_type", "make_key"),
    [
        ("uuid", "timestamptz", lambda i: str(uuid.uuid4())),
        ("varchar(64)", "timestamp", lambda i: f"customer-{i:05d}"),
    ],
)
def test_text_primary_keys_scan_and_delete(
    admin: psycopg.Connection[tuple[object, ...]],
    make_kind: MakeKind,
    cutoff: datetime,
    key_type: str,
    ts_type: str,
    make_key: Callable[[int], str],
) -> None:
    # Given a table keyed by uuid or varchar, 40 rows expired and 10 fresh
    name = f"receipts_{secrets.token_hex(4)}"
    ident = sql.Identifier(name)
    admin.execute(
        sql.SQL("CREATE TABLE {t} (receipt {k} PRIMARY KEY, sent_at {ts})").format(
            t=ident, k=sql.SQL(key_type), ts=sql.SQL(ts_type)
        )
    )
    keys = [make_key(i) for i in range(50)]
    with admin.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {t} VALUES (%s, now() - %s * interval '1 day')").format(t=ident),
            [(key, 1 if i % FRESH_EVERY == 0 else 30) for i, key in enumerate(keys)],
        )
    in_order = [
        str(r[0])
        for r in admin.execute(
            sql.SQL(
                "SELECT receipt::text FROM {t} WHERE sent_at < now() - interval '7 days'"
                " ORDER BY receipt"
            ).format(t=ident)
        )
    ]
    kind = make_kind(name, primary_key="receipt", timestamp_column="sent_at")
    kind.scan_page_size = 7
    # When it is scanned in small pages and every expired key is deleted
    pages = list(kind.scan(cutoff))
    expired = [item for page in pages for item in page.expired]
    results = kind.delete(expired, cutoff)
    # Then the scan saw each row once in key order, and exactly the expired rows went
    assert expired == in_order
    assert len(expired) == 40
    assert sum(page.scanned for page in pages) == 50
    assert {r.outcome for r in results} == {Outcome.DELETED}
    assert count(admin, name) == 10
    assert all(kind.out_of_scope(key) is None for key in keys)
    admin.execute(sql.SQL("DROP TABLE {t}").format(t=ident))


def test_empty_string_is_a_real_text_key(
    admin: psycopg.Connection[tuple[object, ...]], make_kind: MakeKind, cutoff: datetime
) -> None:
    # Given a text-keyed table whose expired rows include the key ''
    name = f"receipts_{secrets.token_hex(4)}"
    ident = sql.Identifier(name)
    admin.execute(sql.SQL("CREATE TABLE {t} (k text PRIMARY KEY, at date)").format(t=ident))
    admin.execute(
        sql.SQL("INSERT INTO {t} VALUES ('', '2000-01-01'), ('a', '2000-01-01')").format(t=ident)
    )
    kind = make_kind(name, primary_key="k", timestamp_column="at")
    # When it is scanned, checked and deleted
    expired = [key for page in kind.scan(cutoff) for key in page.expired]
    # Then '' is in scope and is deleted like any other key
    assert expired == ["", "a"]
    assert kind.out_of_scope("") is None
    assert [r.outcome for r in kind.delete(expired, cutoff)] == [Outcome.DELETED] * 2
    assert count(admin, name) == 0
    admin.execute(sql.SQL("DROP TABLE {t}").format(t=ident))


def test_out_of_scope_refuses_what_cannot_be_a_bigint_key(table: str, make_kind: MakeKind) -> None:
    # Given a table keyed by bigint
    kind = make_kind(table)
    # When items are checked
    # Then only canonical bigint values are in scope
    assert kind.out_of_scope("42") is None
    assert kind.out_of_scope("-9223372036854775808") is None
    assert kind.out_of_scope("") == "empty"
    assert "canonical" in (kind.out_of_scope("007") or "")
    assert "canonical" in (kind.out_of_scope("abc") or "")
    assert "range" in (kind.out_of_scope("9223372036854775808") or "")
    assert "bytes" in (kind.out_of_scope("9" * 3000) or "")


def test_lost_connection_is_transient_and_the_next_call_reconnects(
    table: str, make_kind: MakeKind, admin: psycopg.Connection[tuple[object, ...]], cutoff: datetime
) -> None:
    # Given a kind whose session the server has ended
    kind = make_kind(table)
    assert kind.remaining(cutoff) == 4000
    admin.execute(
        # The timeout makes it wait until the session is really gone.
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
        " WHERE application_name = 'digest-cleanup' AND datname = current_database()"
    )
    batch = expired_ids(1, 10)
    # When it deletes a batch, and then the same batch again
    first = kind.delete(batch, cutoff)
    second = kind.delete(batch, cutoff)
    # Then the first attempt is transient, and the retry reconnects and deletes
    assert {(r.outcome, r.code) for r in first} == {(Outcome.TRANSIENT, "connection_error")}
    assert {r.outcome for r in second} == {Outcome.DELETED}


def test_missing_table_is_permanent_undefined_table(make_kind: MakeKind, cutoff: datetime) -> None:
    # Given a target naming a table that does not exist
    kind = make_kind("public.no_such_table")
    # When it deletes or scans
    results = kind.delete(["1", "2"], cutoff)
    # Then every item fails permanently, and the scan raises the same error
    assert {(r.outcome, r.code) for r in results} == {(Outcome.PERMANENT, "undefined_table")}
    with pytest.raises(PermanentError, match="no_such_table"):
        list(kind.scan(cutoff))


def test_key_column_without_unique_index_is_refused(
    table: str, make_kind: MakeKind, cutoff: datetime
) -> None:
    # Given a target whose key column is not unique
    kind = make_kind(table, primary_key="customer")
    # When it scans
    # Then it refuses, because keyset pages would skip rows that share a key
    with pytest.raises(PermanentError) as caught:
        list(kind.scan(cutoff))
    assert caught.value.code == "not_unique"


@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (psycopg.errors.LockNotAvailable, TransientError, "lock_timeout"),
        (psycopg.errors.SerializationFailure, TransientError, "serialization_failure"),
        (psycopg.errors.DeadlockDetected, TransientError, "deadlock"),
        (psycopg.errors.QueryCanceled, TransientError, "statement_timeout"),
        (psycopg.errors.AdminShutdown, TransientError, "connection_error"),
        (psycopg.errors.TooManyConnections, TransientError, "server_busy"),
        (psycopg.OperationalError, TransientError, "connection_error"),
        (psycopg.errors.InsufficientPrivilege, PermanentError, "permission_denied"),
        (psycopg.errors.UndefinedTable, PermanentError, "undefined_table"),
        (psycopg.errors.UndefinedColumn, PermanentError, "undefined_table"),
        (psycopg.errors.InvalidTextRepresentation, PermanentError, "invalid_key"),
        (psycopg.errors.ForeignKeyViolation, PermanentError, "still_referenced"),
    ],
)
def test_errors_map_to_transient_or_permanent(
    error: type[psycopg.Error], kind: type[Exception], code: str
) -> None:
    # Given a psycopg error
    # When it is classified
    mapped = classify(error("boom"))
    # Then it lands in the right branch of the tree with a short code
    assert type(mapped) is kind
    assert mapped.code == code


TARGETS = """
[targets.snapshots]
kind = "postgres"
retention_days = 0
schedule = "0 3 * * 0"
table = "public.customer_snapshots"
primary_key = "id"
timestamp_column = "created_at"
{extra}
"""


def test_unknown_field_in_a_postgres_target_is_named() -> None:
    # Given a postgres target with a field the kind does not know
    text = TARGETS.format(extra='colour = "blue"')
    # When the targets file is parsed
    # Then the error names the target and the field
    with pytest.raises(TargetsFileError, match=r"targets\.snapshots: unknown field 'colour'"):
        parse_targets(text)


def test_identifier_that_is_not_plain_sql_is_refused() -> None:
    # Given a table name that tries to smuggle SQL
    text = TARGETS.format(extra="").replace(
        "public.customer_snapshots", "snapshots; DROP TABLE customers"
    )
    # When the targets file is parsed
    # Then the table field is refused
    with pytest.raises(TargetsFileError, match=r"targets\.snapshots\.table"):
        parse_targets(text)


def test_dsn_pasted_into_dsn_env_is_refused_without_echoing_it() -> None:
    # Given a DSN with a password written where the variable NAME belongs
    text = TARGETS.format(extra='dsn_env = "postgresql://app:hunter2@db/prod"')
    # When the targets file is parsed
    with pytest.raises(TargetsFileError, match=r"targets\.snapshots\.dsn_env") as caught:
        parse_targets(text)
    # Then the message does not repeat the password
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("dsn_env", [None, "SNAPSHOTS_DSN"])
def test_missing_dsn_variable_is_named(dsn_env: str | None) -> None:
    # Given a postgres target, and an environment without its DSN variable
    extra = f'dsn_env = "{dsn_env}"' if dsn_env else ""
    target = parse_targets(TARGETS.format(extra=extra)).get("snapshots")
    # When its kind is built
    with pytest.raises(SettingsError) as caught:
        target.make_kind(Settings(env={"OTHER": "x"}))
    # Then the error names the variable and how to fix it
    expected = dsn_env or "CLEANUP_POSTGRES_DSN"
    assert caught.value.name == expected
    assert str(caught.value).startswith(f"{expected}: is not set; set it to a PostgreSQL DSN")


def test_describe_never_shows_the_dsn() -> None:
    # Given a kind whose DSN holds a password
    target = parse_targets(TARGETS.format(extra="")).get("snapshots")
    kind = target.make_kind(
        Settings(env={"CLEANUP_POSTGRES_DSN": "postgresql://app:hunter2@db.internal/prod"})
    )
    # When it describes itself
    # Then only the table shows
    assert kind.describe() == "postgres://public.customer_snapshots"


def test_malformed_dsn_is_named_without_echoing_it() -> None:
    # Given a DSN variable holding a password and a syntax error
    target = parse_targets(TARGETS.format(extra="")).get("snapshots")
    settings = Settings(env={"CLEANUP_POSTGRES_DSN": "host=db password=hunter2 oops"})
    # When the kind is built
    with pytest.raises(SettingsError) as caught:
        target.make_kind(settings)
    # Then the error names the variable, not its value, and chains nothing that could
    assert caught.value.name == "CLEANUP_POSTGRES_DSN"
    assert "hunter2" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
