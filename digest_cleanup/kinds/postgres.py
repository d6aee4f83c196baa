"""The PostgreSQL kind: expired rows of one table, deleted by primary key.

It serves per-customer snapshot rows and delivery receipts.  An item is a
primary-key value in PostgreSQL's own text form (``pk::text``).  That form casts
back to the key's type, so every statement compares the key column itself and
the primary-key index stays usable.

How it uses the database:

* one connection per kind instance (so one per worker process).  It is opened
  lazily, and opened again on the next call after it breaks;
* autocommit is off, and every call runs in its own short transaction, so no
  snapshot or row lock outlives a call;
* :meth:`PostgresKind.scan` walks the primary-key index with keyset pagination,
  never OFFSET;
* :meth:`PostgresKind.delete` runs one ``DELETE ... = ANY(...) AND ts < cutoff``
  per batch.  The statement that deletes a row also checks that it is still
  expired.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus

from digest_cleanup.config.settings import Settings
from digest_cleanup.errors import (
    ItemError,
    PermanentError,
    SettingsError,
    TargetsFileError,
    TransientError,
)
from digest_cleanup.kinds.base import CHANGED_SINCE_LISTING, ItemResult, Outcome, Page, TargetKind

#: The environment variable holding the DSN when a target names none.
DEFAULT_DSN_ENV = "CLEANUP_POSTGRES_DSN"
#: Rows one scan query reads.  Each page is one bounded range scan of the
#: primary-key index, so its cost stays the same however few rows have expired.
SCAN_PAGE_SIZE = 1000
#: How long a delete waits for a row that another transaction holds.  Without it
#: a batch waits on a stuck transaction forever while its Celery message stays
#: unacknowledged.  When it fires, the batch fails as TRANSIENT lock_timeout and is retried.
LOCK_TIMEOUT = "5s"
#: The longest one statement may run.  A 1000-row delete by primary key takes
#: milliseconds, so a statement still running after this is stuck.  It must stay
#: well below the broker's visibility timeout.
STATEMENT_TIMEOUT = "60s"
#: ``remaining`` counts over the whole table (no index on the timestamp is assumed),
#: so it gets more time than a delete.  It runs only when a run is verified.
COUNT_STATEMENT_TIMEOUT = "10min"
#: The server ends a session left idle inside a transaction (a worker frozen
#: between the DELETE and the COMMIT) after this long, which frees its row locks.
IDLE_IN_TRANSACTION_TIMEOUT = "60s"
#: Seconds to wait for a TCP connection, unless the DSN says otherwise.
CONNECT_TIMEOUT = 10
#: Items longer than this many bytes are refused.  It is the B-tree limit of about a
#: third of an 8 kB page: only a key that compresses well can be longer, and
#: realistic keys are far shorter.
MAX_KEY_BYTES = 2704
#: One delete transaction holds its rows' locks until it commits, and one locked row
#: fails the whole batch.  1000, the same cap as S3, keeps both small.  At that
#: size the per-batch overhead (one task, two round trips) is already negligible
#: next to the row work.  PostgreSQL itself would accept much larger arrays.
MAX_BATCH_SIZE = 1000

#: SQLSTATEs (or two-character SQLSTATE classes) worth retrying, with their short codes.
TRANSIENT_SQLSTATES: Mapping[str, str] = {
    "55P03": "lock_timeout",  # lock_not_available: lock_timeout fired
    "40001": "serialization_failure",
    "40P01": "deadlock",
    "57014": "statement_timeout",  # query_canceled: statement_timeout or a cancel request
    "57P01": "connection_error",  # admin_shutdown: the server ended our session
    "57P02": "connection_error",  # crash_shutdown
    "57P03": "connection_error",  # cannot_connect_now: the server is starting or stopping
    "25P03": "connection_error",  # idle_in_transaction_session_timeout ended the session
    "08": "connection_error",  # connection_exception and its subclasses
    "53": "server_busy",  # insufficient_resources: too many connections, disk full, memory
}
#: SQLSTATEs (or classes) that retrying cannot fix, with their short codes.
PERMANENT_SQLSTATES: Mapping[str, str] = {
    "42501": "permission_denied",  # insufficient_privilege
    "42P01": "undefined_table",
    "42703": "undefined_table",  # undefined_column: the options name a missing column
    "3F000": "undefined_table",  # invalid_schema_name
    "22P02": "invalid_key",  # invalid_text_representation: an item is not of the key type
    "22003": "invalid_key",  # numeric_value_out_of_range
    "23503": "still_referenced",  # foreign_key_violation: another table's rows point here
    "28": "authentication_failed",  # invalid_authorization_specification
}

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CANONICAL_INTEGER = re.compile(r"^-?(0|[1-9][0-9]*)$")
_CANONICAL_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_INTEGER_BITS = {"int2": 16, "int4": 32, "int8": 64}
_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "citext", "name"})
_TIMESTAMP_TYPES = frozenset({"timestamptz", "timestamp", "date"})


@dataclasses.dataclass(frozen=True)
class PostgresOptions:
    """The ``kind = "postgres"`` fields of a target."""

    #: ``table`` or ``schema.table``; names are quoted, so they match exactly as written.
    table: str
    #: A column with a single-column unique index, normally the primary key.
    primary_key: str
    #: Rows whose value here is older than the cutoff have expired; NULL never expires.
    timestamp_column: str
    #: The NAME of the environment variable that holds the DSN (never the DSN itself).
    dsn_env: str = DEFAULT_DSN_ENV


@dataclasses.dataclass(frozen=True, slots=True)
class _KeyType:
    """The primary key column's type, looked up once per instance."""

    schema: str
    name: str  # pg_type.typname: int8, uuid, varchar, ...
    display: str  # format_type(): bigint, uuid, character varying(64), ...
    max_chars: int | None  # the n of varchar(n) or char(n)

    @property
    def array(self) -> sql.Composable:
        return sql.SQL("{}[]").format(sql.Identifier(self.schema, self.name))


class _Column(NamedTuple):
    """One row of ``_COLUMNS_SQL`` after the column name."""

    attnum: int
    typname: str
    schema: str
    typmod: int
    display: str


class PostgresKind(TargetKind):
    """Rows of one table, keyed by a unique column and expired by a timestamp column."""

    name = "postgres"
    Options = PostgresOptions
    max_batch_size = MAX_BATCH_SIZE
    options: PostgresOptions

    def __init__(self, target: str, options: PostgresOptions, settings: Settings) -> None:
        super().__init__(target, options, settings)
        _validate(target, options)
        dsn = settings.env.get(options.dsn_env)
        if not dsn:
            raise SettingsError(
                options.dsn_env,
                "is not set",
                "set it to a PostgreSQL DSN such as postgresql://user@host/db",
            )
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError:
            # from None: the parser's message quotes the DSN, which may hold a password.
            raise SettingsError(
                options.dsn_env,
                "is not a valid PostgreSQL DSN",
                "use postgresql://user@host:port/db or 'host=... dbname=...'",
            ) from None
        defaults: dict[str, str | int] = {
            "connect_timeout": CONNECT_TIMEOUT,
            "application_name": "digest-cleanup",
        }
        self._conninfo = make_conninfo(
            dsn, **{k: v for k, v in defaults.items() if k not in params}
        )
        self._table = sql.Identifier(*options.table.split("."))
        self._pk = sql.Identifier(options.primary_key)
        self._ts = sql.Identifier(options.timestamp_column)
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._conn_pid = 0
        self._key: _KeyType | None = None
        # Calls are serialized, so a thread pool sharing one instance stays correct.
        self._lock = threading.RLock()
        #: Session timeouts (applied when a connection opens) and the scan page size.
        self.lock_timeout = LOCK_TIMEOUT
        self.statement_timeout = STATEMENT_TIMEOUT
        self.scan_page_size = SCAN_PAGE_SIZE

    @classmethod
    def parse_options(cls, target: str, raw: Mapping[str, Any]) -> PostgresOptions:
        """Build and validate the options, so a bad identifier fails when the file loads."""
        options: PostgresOptions = super().parse_options(target, raw)
        _validate(target, options)
        return options

    def describe(self) -> str:
        """``postgres://<table>``; never the DSN, which may hold a password."""
        return f"postgres://{self.options.table}"

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        """Page through every row in key order, marking those older than ``cutoff``.

        It reads all rows, not just the expired ones.  ``WHERE ts < cutoff`` without
        an index on ``ts`` can walk the whole table to fill one page, but a range of
        the key index costs the same on every page.  ``scanned`` then counts the table.
        """
        cursor = start_after
        while True:
            with self._mapped_errors():
                key = self._key_type()
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(
                        self._scan_sql(key, first=cursor is None),
                        {"cutoff": cutoff, "after": cursor, "limit": self.scan_page_size},
                    )
                    rows = cur.fetchall()
            if not rows:
                return
            cursor = rows[-1][0]
            # A NULL timestamp compares as NULL, never true: such a row never expires.
            expired = [pk for pk, is_expired in rows if is_expired]
            yield Page(scanned=len(rows), expired=expired, cursor=cursor)
            if len(rows) < self.scan_page_size:
                return

    def delete(
        self, items: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[ItemResult]:
        """Delete the still-expired rows among ``items`` in one transaction."""
        if not items:
            return []
        try:
            with self._mapped_errors():
                key = self._key_type()
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(self._delete_sql(key), {"items": list(items), "cutoff": cutoff})
                    deleted = {row[0] for row in cur.fetchall()}
                    rest = [item for item in items if item not in deleted]
                    present: set[str] = set()
                    if rest:
                        cur.execute(self._exists_sql(key), {"items": rest})
                        present = {row[0] for row in cur.fetchall()}
        except ItemError as exc:
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            return [ItemResult(item, outcome, exc.code, exc.message) for item in items]
        results = []
        for item in items:
            if item in present:
                # Still there but not deleted: it was rewritten after the sweep.
                results.append(
                    ItemResult(
                        item, Outcome.SKIPPED, CHANGED_SINCE_LISTING, "updated since the sweep"
                    )
                )
            else:
                # Deleted now, or already gone: deleting is idempotent.
                results.append(ItemResult(item, Outcome.DELETED))
        return results

    def out_of_scope(self, item: str) -> str | None:
        """Why ``item`` cannot be a key of this table (it reads after "an item is"), or ``None``.

        It looks the key type up on first use, so it may raise an :class:`ItemError`.
        """
        if "\x00" in item:
            return "holding a NUL character, which PostgreSQL text cannot store"
        if len(item.encode()) > MAX_KEY_BYTES:
            return f"longer than {MAX_KEY_BYTES} bytes, more than an index entry holds"
        with self._mapped_errors():
            key = self._key_type()
        if not item and key.name not in _TEXT_TYPES:
            # '' is a legal text key, and refusing it would poison every batch it lands in.
            return "empty"
        bits = _INTEGER_BITS.get(key.name)
        if bits is not None:
            if not _CANONICAL_INTEGER.match(item):
                return f"not a {key.display} in canonical form"
            if not -(2 ** (bits - 1)) <= int(item) < 2 ** (bits - 1):
                return f"out of range for {key.display}"
        elif key.name == "uuid" and not _CANONICAL_UUID.match(item):
            return "not a uuid in canonical lowercase form"
        elif key.max_chars is not None and len(item) > key.max_chars:
            return f"longer than {key.display} allows"
        return None

    def remaining(self, cutoff: datetime) -> int:
        """``count(*)`` of the rows still older than ``cutoff``."""
        with self._mapped_errors():
            self._key_type()
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [COUNT_STATEMENT_TIMEOUT]
                )
                count = sql.SQL("SELECT count(*) FROM {t} WHERE {ts} < %s")
                cur.execute(count.format(t=self._table, ts=self._ts), [cutoff])
                row = cur.fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        with self._lock:
            self._drop_connection()

    def _scan_sql(self, key: _KeyType, *, first: bool) -> sql.Composed:
        where = (
            sql.SQL("")
            if first
            else sql.SQL("WHERE src.{pk} > %(after)s::{type}").format(
                pk=self._pk, type=sql.Identifier(key.schema, key.name)
            )
        )
        # ORDER BY names src.pk: a bare "pk" would sort by the output column
        # pk::text, which carries the same name, and 10 would come before 9.
        return sql.SQL(
            "SELECT src.{pk}::text, src.{ts} < %(cutoff)s FROM {t} AS src {where}"
            " ORDER BY src.{pk} LIMIT %(limit)s"
        ).format(pk=self._pk, ts=self._ts, t=self._table, where=where)

    def _delete_sql(self, key: _KeyType) -> sql.Composed:
        return sql.SQL(
            "DELETE FROM {t} WHERE {pk} = ANY(%(items)s::{array}) AND {ts} < %(cutoff)s"
            " RETURNING {pk}::text"
        ).format(t=self._table, pk=self._pk, ts=self._ts, array=key.array)

    def _exists_sql(self, key: _KeyType) -> sql.Composed:
        # It answers with the items as sent, so an item that is not in canonical
        # text form still maps back to itself.
        return sql.SQL(
            "SELECT req.item FROM unnest(%(items)s::text[]) AS req(item)"
            " WHERE EXISTS (SELECT 1 FROM {t} WHERE {pk} = req.item::{type})"
        ).format(t=self._table, pk=self._pk, type=sql.Identifier(key.schema, key.name))

    def _key_type(self) -> _KeyType:
        """Look up (once) the key's type, and check the table and both columns."""
        if self._key is not None:
            return self._key
        o = self.options
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)::oid", [self._table.as_string(conn)])
            row = cur.fetchone()
            oid = row[0] if row else None
            if oid is None:
                raise PermanentError("undefined_table", f"table {o.table} does not exist")
            cur.execute(_COLUMNS_SQL, [oid, [o.primary_key, o.timestamp_column]])
            columns = {r[0]: _Column(*r[1:]) for r in cur.fetchall()}
            for name in (o.primary_key, o.timestamp_column):
                if name not in columns:
                    raise PermanentError("undefined_table", f"{o.table} has no column {name}")
            pk, ts = columns[o.primary_key], columns[o.timestamp_column]
            cur.execute(_UNIQUE_SQL, [oid, pk.attnum])
            unique = cur.fetchone()
        if ts.typname not in _TIMESTAMP_TYPES:
            raise PermanentError(
                "unsupported_column_type",
                f"{o.table}.{o.timestamp_column} is {ts.display}; "
                "use a timestamptz, timestamp or date column",
            )
        if not (unique and unique[0]):
            # Keyset pagination would skip rows sharing a key across a page boundary.
            raise PermanentError(
                "not_unique",
                f"{o.table}.{o.primary_key} has no single-column unique index; "
                "name the primary key",
            )
        if not (_IDENTIFIER.match(pk.typname) and _IDENTIFIER.match(pk.schema)):
            raise PermanentError("unsupported_column_type", f"key type {pk.display} is unsupported")
        # varchar(n) and char(n) store n + 4 in atttypmod; -1 means no limit.
        limited = pk.typname in ("varchar", "bpchar") and pk.typmod >= 4
        self._key = _KeyType(
            schema=pk.schema,
            name=pk.typname,
            display=pk.display,
            max_chars=pk.typmod - 4 if limited else None,
        )
        return self._key

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken or self._conn_pid != os.getpid()):
            self._drop_connection()
            conn = None
        if conn is None:
            conn = psycopg.connect(self._conninfo, autocommit=True)
            try:
                # Set once per session, with autocommit on, so they outlast every transaction.
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, false),"
                    " set_config('statement_timeout', %s, false),"
                    " set_config('idle_in_transaction_session_timeout', %s, false),"
                    # A timestamp without time zone column is read as UTC, as cutoffs are.
                    " set_config('TimeZone', 'UTC', false)",
                    [self.lock_timeout, self.statement_timeout, IDLE_IN_TRANSACTION_TIMEOUT],
                )
                conn.autocommit = False
            except BaseException:
                conn.close()
                raise
            self._conn, self._conn_pid = conn, os.getpid()
        return conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        # A connection inherited through fork belongs to the parent: leave its socket alone.
        if conn is not None and self._conn_pid == os.getpid():
            conn.close()

    @contextlib.contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        """Serialize one call; raise psycopg errors as :class:`ItemError` via :func:`classify`."""
        with self._lock:
            try:
                yield
            except psycopg.Error as exc:
                self._after_error()
                raise classify(exc) from exc

    def _after_error(self) -> None:
        """Drop a connection that broke, or that an error left inside a transaction."""
        conn = self._conn
        if conn is not None and (
            conn.broken or conn.info.transaction_status != TransactionStatus.IDLE
        ):
            self._drop_connection()


def classify(exc: psycopg.Error) -> ItemError:
    """Map one psycopg error to a :class:`TransientError` or :class:`PermanentError`."""
    state = exc.sqlstate or ""
    message = _short_message(exc)
    for table, error in (
        (TRANSIENT_SQLSTATES, TransientError),
        (PERMANENT_SQLSTATES, PermanentError),
    ):
        code = table.get(state) or table.get(state[:2])
        if code:
            return error(code, message)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        # Without a SQLSTATE, libpq lost the connection or never made it.
        return TransientError("database_error" if state else "connection_error", message)
    return PermanentError("database_error", message)


def _short_message(exc: psycopg.Error) -> str:
    text = (exc.diag.message_primary if exc.sqlstate else None) or str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _validate(target: str, options: PostgresOptions) -> None:
    parts = options.table.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
        raise TargetsFileError(
            f"targets.{target}.table: {options.table!r} is not 'table' or 'schema.table' made of "
            "SQL identifiers (1-63 letters, digits or '_', not starting with a digit)"
        )
    for field in ("primary_key", "timestamp_column"):
        value = getattr(options, field)
        if not _IDENTIFIER.match(value):
            raise TargetsFileError(
                f"targets.{target}.{field}: {value!r} is not a column name "
                "(1-63 letters, digits or '_', not starting with a digit)"
            )
    if options.primary_key == options.timestamp_column:
        raise TargetsFileError(f"targets.{target}.timestamp_column: must differ from primary_key")
    if not _ENV_NAME.match(options.dsn_env):
        # The value is not echoed: someone may have pasted a DSN with its password here.
        raise TargetsFileError(
            f"targets.{target}.dsn_env: must be the NAME of an environment variable "
            "(letters, digits, '_') that holds the DSN, never the DSN itself"
        )


_COLUMNS_SQL = """
SELECT a.attname, a.attnum, t.typname, n.nspname, a.atttypmod, format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE a.attrelid = %s AND a.attname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""

_UNIQUE_SQL = """
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_index
    WHERE indrelid = %s AND indisunique AND indpred IS NULL AND indnkeyatts = 1 AND indkey[0] = %s
)
"""
