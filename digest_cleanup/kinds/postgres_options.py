"""The fields of a PostgreSQL target, checked when the targets file loads."""

from __future__ import annotations

import dataclasses
import re

from digest_cleanup.errors import TargetsFileError

#: The environment variable holding the DSN when a target names none.
DEFAULT_DSN_ENV = "CLEANUP_POSTGRES_DSN"
#: A plain SQL identifier: what table, column and type names must be here.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


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


def validate(target: str, options: PostgresOptions) -> None:
    """Refuse options that name no plain table or column, or that hold a DSN itself."""
    parts = options.table.split(".")
    if len(parts) > 2 or not all(IDENTIFIER.match(p) for p in parts):
        raise TargetsFileError(
            f"targets.{target}.table: {options.table!r} is not 'table' or 'schema.table' made of "
            "SQL identifiers (1-63 letters, digits or '_', not starting with a digit)"
        )
    for field in ("primary_key", "timestamp_column"):
        value = getattr(options, field)
        if not IDENTIFIER.match(value):
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
