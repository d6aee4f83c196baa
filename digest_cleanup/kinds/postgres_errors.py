"""How the PostgreSQL kind reads psycopg's errors: transient or permanent, by SQLSTATE."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from digest_cleanup.errors import PermanentError, StoreError, TransientError

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
    "22P02": "invalid_key",  # invalid_text_representation: a key is not of the key type
    "22003": "invalid_key",  # numeric_value_out_of_range
    "23503": "still_referenced",  # foreign_key_violation: another table's rows point here
    "28": "authentication_failed",  # invalid_authorization_specification
}


def classify(exc: psycopg.Error) -> StoreError:
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
