"""The PostgreSQL kind: expired rows of one table, deleted by primary key.

It serves per-customer snapshot rows and delivery receipts.  A key is a
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
  expired;
* a ``date`` column is kept to the end of its day: a row dated D expires once
  D+1 00:00 UTC is at or before the cutoff, never on D itself.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from digest_cleanup.errors import SettingsError, StoreError, TransientError
from digest_cleanup.kinds import postgres_catalog
from digest_cleanup.kinds.base import CHANGED_SINCE_LISTING, KeyResult, Outcome, Page, TargetKind
from digest_cleanup.kinds.postgres_catalog import KeyType
from digest_cleanup.kinds.postgres_errors import classify
from digest_cleanup.kinds.postgres_options import PostgresOptions, validate
from digest_cleanup.settings import Settings

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
#: Keys longer than this many bytes are refused.  It is the B-tree limit of about a
#: third of an 8 kB page: only a key that compresses well can be longer, and
#: realistic keys are far shorter.
MAX_KEY_BYTES = 2704
#: One delete transaction holds its rows' locks until it commits, and one locked row
#: fails the whole batch.  1000, the same cap as S3, keeps both small.  At that
#: size the per-batch overhead (one task, two round trips) is already negligible
#: next to the row work.  PostgreSQL itself would accept much larger arrays.
MAX_BATCH_SIZE = 1000


class PostgresKind(TargetKind):
    """Rows of one table, keyed by a unique column and expired by a timestamp column."""

    name = "postgres"
    Options = PostgresOptions
    max_batch_size = MAX_BATCH_SIZE
    options: PostgresOptions

    def __init__(self, target: str, options: PostgresOptions, settings: Settings) -> None:
        super().__init__(target, options, settings)
        validate(target, options)
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
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._conn_pid = 0
        self._key: KeyType | None = None
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
        validate(target, options)
        return options

    @classmethod
    def namespace(cls, options: PostgresOptions) -> tuple[str, str]:
        """``(postgres://$DSN_ENV, schema/table/)``: two targets on one table overlap.

        The store is the DSN's variable, the only name of the database the targets file
        has; two variables holding one DSN are not caught.  An unqualified table is taken
        as ``public``'s, PostgreSQL's default ``search_path``: a false alarm there is the
        safe side, and ``overlaps`` says it is meant.  The table ends in ``/`` so that
        ``events`` does not contain ``events_archive``.
        """
        schema, _, table = options.table.rpartition(".")
        return f"postgres://${options.dsn_env}", f"{schema or 'public'}/{table}/"

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
                        {
                            "cutoff": key.expiry_bound(cutoff),
                            "after": cursor,
                            "limit": self.scan_page_size,
                        },
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
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        """Delete the still-expired rows among ``keys`` in one transaction."""
        if not keys:
            return []
        try:
            with self._mapped_errors():
                key = self._key_type()
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cur:
                    bound = key.expiry_bound(cutoff)
                    cur.execute(self._delete_sql(key), {"items": list(keys), "cutoff": bound})
                    deleted = {row[0] for row in cur.fetchall()}
                    rest = [item for item in keys if item not in deleted]
                    present: set[str] = set()
                    if rest:
                        cur.execute(self._exists_sql(key), {"items": rest})
                        present = {row[0] for row in cur.fetchall()}
        except StoreError as exc:
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            return [KeyResult(item, outcome, exc.code, exc.message) for item in keys]
        results = []
        for item in keys:
            if item in present:
                # Still there but not deleted: it was rewritten after the sweep.
                results.append(
                    KeyResult(
                        item, Outcome.SKIPPED, CHANGED_SINCE_LISTING, "updated since the sweep"
                    )
                )
            else:
                # Deleted now, or already gone: deleting is idempotent.
                results.append(KeyResult(item, Outcome.DELETED))
        return results

    def out_of_scope(self, key: str) -> str | None:
        """Why ``key`` cannot be a key of this table (it reads after "a key is"), or ``None``.

        It looks the key type up on first use, so it may raise a :class:`StoreError`.
        """
        if "\x00" in key:
            return "holding a NUL character, which PostgreSQL text cannot store"
        if len(key.encode()) > MAX_KEY_BYTES:
            return f"longer than {MAX_KEY_BYTES} bytes, more than an index entry holds"
        with self._mapped_errors():
            key_type = self._key_type()
        return key_type.refuses(key)

    def remaining(self, cutoff: datetime) -> int:
        """``count(*)`` of the rows still older than ``cutoff``."""
        with self._mapped_errors():
            key = self._key_type()
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [COUNT_STATEMENT_TIMEOUT]
                )
                count = sql.SQL("SELECT count(*) FROM {t} WHERE {ts} < %s")
                cur.execute(count.format(t=self._table, ts=self._ts), [key.expiry_bound(cutoff)])
                row = cur.fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        with self._lock:
            self._drop_connection()

    def _scan_sql(self, key: KeyType, *, first: bool) -> sql.Composed:
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

    def _delete_sql(self, key: KeyType) -> sql.Composed:
        return sql.SQL(
            "DELETE FROM {t} WHERE {pk} = ANY(%(items)s::{array}) AND {ts} < %(cutoff)s"
            " RETURNING {pk}::text"
        ).format(t=self._table, pk=self._pk, ts=self._ts, array=key.array)

    def _exists_sql(self, key: KeyType) -> sql.Composed:
        # It answers with the keys as sent, so a key that is not in canonical
        # text form still maps back to itself.
        return sql.SQL(
            "SELECT req.item FROM unnest(%(items)s::text[]) AS req(item)"
            " WHERE EXISTS (SELECT 1 FROM {t} WHERE {pk} = req.item::{type})"
        ).format(t=self._table, pk=self._pk, type=sql.Identifier(key.schema, key.name))

    def _key_type(self) -> KeyType:
        """Look up (once) the key's type, and check the table and both columns."""
        if self._key is None:
            self._key = postgres_catalog.look_up(self._connection(), self._table, self.options)
        return self._key

    def _connection(self) -> psycopg.Connection[TupleRow]:
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
        """Serialize one call; raise psycopg errors as :class:`StoreError` via :func:`classify`."""
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
