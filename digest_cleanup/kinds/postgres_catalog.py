"""The key of a PostgreSQL target's table, read from the system catalog, and what fits it.

:func:`look_up` checks the table, its key and timestamp columns and the key's
single-column unique index once per kind instance; :meth:`KeyType.refuses` then
tells, without a query, why a key cannot be a value of the key.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, date, datetime
from typing import NamedTuple

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from digest_cleanup.errors import PermanentError
from digest_cleanup.kinds.postgres_options import IDENTIFIER, PostgresOptions

#: An integer key as PostgreSQL writes it, and a uuid key likewise.
CANONICAL_INTEGER = re.compile(r"^-?(0|[1-9][0-9]*)$")
CANONICAL_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: Bits of each integer key type.
INTEGER_BITS = {"int2": 16, "int4": 32, "int8": 64}
#: Key types for which '' is a value.
TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "citext", "name"})
#: Column types a timestamp column may have.
TIMESTAMP_TYPES = frozenset({"timestamptz", "timestamp", "date"})


@dataclasses.dataclass(frozen=True, slots=True)
class KeyType:
    """The primary key column's type, looked up once per instance."""

    schema: str
    name: str  # pg_type.typname: int8, uuid, varchar, ...
    display: str  # format_type(): bigint, uuid, character varying(64), ...
    max_chars: int | None  # the n of varchar(n) or char(n)
    #: The timestamp column is a ``date``: a row dated D is kept all of D, so it expires
    #: once D+1 00:00 UTC is at or before the cutoff (see :meth:`expiry_bound`).
    day_column: bool = False

    def expiry_bound(self, cutoff: datetime) -> datetime | date:
        """What the timestamp column is compared with: ``ts < bound`` has expired.

        A ``date`` compared with a timestamp counts as its midnight, so a row dated
        on the cutoff's day would go up to a day inside retention; compared with the
        cutoff's own UTC date instead, ``D < date(cutoff)`` is exactly
        ``D+1 00:00 <= cutoff``.
        """
        return cutoff.astimezone(UTC).date() if self.day_column else cutoff

    @property
    def array(self) -> sql.Composable:
        return sql.SQL("{}[]").format(sql.Identifier(self.schema, self.name))

    def refuses(self, key: str) -> str | None:
        """Why ``key`` cannot be a value of this type (it reads after "a key is"), or None."""
        if not key and self.name not in TEXT_TYPES:
            # '' is a legal text key, and refusing it would poison every batch it lands in.
            return "empty"
        bits = INTEGER_BITS.get(self.name)
        if bits is not None:
            if not CANONICAL_INTEGER.match(key):
                return f"not a {self.display} in canonical form"
            if not -(2 ** (bits - 1)) <= int(key) < 2 ** (bits - 1):
                return f"out of range for {self.display}"
        elif self.name == "uuid" and not CANONICAL_UUID.match(key):
            return "not a uuid in canonical lowercase form"
        elif self.max_chars is not None and len(key) > self.max_chars:
            return f"longer than {self.display} allows"
        return None


class _Column(NamedTuple):
    """One row of ``_COLUMNS_SQL`` after the column name."""

    attnum: int
    typname: str
    schema: str
    typmod: int
    display: str


def look_up(
    conn: psycopg.Connection[TupleRow], table: sql.Identifier, options: PostgresOptions
) -> KeyType:
    """The key's type, after checking the table, both columns and the key's uniqueness."""
    o = options
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)::oid", [table.as_string(conn)])
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
    if ts.typname not in TIMESTAMP_TYPES:
        raise PermanentError(
            "unsupported_column_type",
            f"{o.table}.{o.timestamp_column} is {ts.display}; "
            "use a timestamptz, timestamp or date column",
        )
    if not (unique and unique[0]):
        # Keyset pagination would skip rows sharing a key across a page boundary.
        raise PermanentError(
            "not_unique",
            f"{o.table}.{o.primary_key} has no single-column unique index; name the primary key",
        )
    if not (IDENTIFIER.match(pk.typname) and IDENTIFIER.match(pk.schema)):
        raise PermanentError("unsupported_column_type", f"key type {pk.display} is unsupported")
    # varchar(n) and char(n) store n + 4 in atttypmod; -1 means no limit.
    limited = pk.typname in ("varchar", "bpchar") and pk.typmod >= 4
    return KeyType(
        schema=pk.schema,
        name=pk.typname,
        display=pk.display,
        max_chars=pk.typmod - 4 if limited else None,
        day_column=ts.typname == "date",
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
