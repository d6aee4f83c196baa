"""The audit location: where run reports are kept for good, each written once.

``CLEANUP_AUDIT_URL`` is an ``s3://bucket/prefix/`` location, whatever kind the
target is: the report of a PostgreSQL run goes to S3 too.  Each end of a run
writes ``TARGET/RUN_ID/ENDED_AT-TOKEN/summary.json`` and ``not_deleted.jsonl``
there: a run restarted under the same id (a new token) or redriven (a new end)
adds a report beside the earlier ones, and the run's ``report_url`` names the
latest.  Every object is put with ``If-None-Match: *``, so not even a retry of
the same report overwrites what is there (AWS S3 and ``weed mini`` honour it; a
server that answers ``NotImplemented`` gets a HEAD before each put instead, which
a concurrent writer can race).
The writer lives here, apart from :mod:`digest_cleanup.pipeline.lifecycle`, so that the code
that ends runs never touches a storage client of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from digest_cleanup.clock import now_iso
from digest_cleanup.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Attempts per report object.  A run's report is written once, at its end, so
#: unlike deletes it is retried in place rather than by the pipeline.
WRITE_ATTEMPTS = 5
#: Characters of the run's token in a report's folder: enough to tell incarnations apart.
TOKEN_CHARS = 12
#: Answers to ``If-None-Match: *`` meaning the key exists (412), or another writer is
#: putting it right now (409, AWS's ``ConditionalRequestConflict``): either way, kept.
_EXISTS = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
#: Answers of a server that does not take the condition at all.
_UNSUPPORTED = frozenset({"NotImplemented", "501"})


def report_folder(target: str, run_id: str, summary: Mapping[str, Any]) -> str:
    """``TARGET/RUN_ID/ENDED_AT-TOKEN/``: one folder per end of one run incarnation.

    The end time comes first, in a form that sorts as it reads, so listing a run's
    folder lists its reports oldest first.
    """
    ended = str(summary.get("ended_at") or now_iso())
    stamp = "".join(c for c in ended if c.isalnum())  # 20261025T030000123Z
    token = str(summary.get("token") or "")[:TOKEN_CHARS] or "untokened"
    return f"{target}/{run_id}/{stamp}-{token}/"


def write_report(
    settings: Settings,
    target: str,
    run_id: str,
    summary: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
) -> str | None:
    """Put one run end's report under the audit URL; return its location, or None if unset.

    An object already there (an earlier attempt at this same report) is kept as it is.
    """
    location = _location(settings)
    if location is None:
        return None
    bucket, prefix = location
    base = prefix + report_folder(target, run_id, summary)
    client = _client(settings)
    _put_once(
        client,
        bucket,
        base + "summary.json",
        json.dumps(summary, indent=2, sort_keys=True).encode(),
        "application/json",
    )
    # Last, on this call's own client: the list is empty when every key was deleted,
    # and weed mini stalls the next PutObject on a connection after an empty one until
    # the read timeout (60 s, measured), then the retry finds its own first write.
    _put_once(
        client,
        bucket,
        base + "not_deleted.jsonl",
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode(),
        "application/x-ndjson",
    )
    return f"s3://{bucket}/{base}"


def write_purge(settings: Settings, at: str, records: Sequence[Mapping[str, Any]]) -> str | None:
    """Keep a ``dlq purge``'s audit records under ``purges/``; return the object's URL."""
    return _write_records(settings, "purges", at, records)


def write_abort(settings: Settings, at: str, record: Mapping[str, Any]) -> str | None:
    """Keep an ``abort``'s audit record under ``aborts/``; return the object's URL."""
    return _write_records(settings, "aborts", at, [record])


def _write_records(
    settings: Settings, folder: str, at: str, records: Sequence[Mapping[str, Any]]
) -> str | None:
    location = _location(settings)
    if location is None or not records:
        return None
    bucket, prefix = location
    # The time has whole seconds: the suffix keeps two actions in one second apart.
    key = f"{prefix}{folder}/{at.replace(':', '')}-{uuid.uuid4().hex[:8]}.json"
    body = json.dumps(list(records), indent=2, sort_keys=True).encode()
    _put_once(_client(settings), bucket, key, body, "application/json")
    return f"s3://{bucket}/{key}"


class _Put(TypedDict):
    """A report object's PutObject, its condition aside."""

    Bucket: str
    Key: str
    Body: bytes
    ContentType: str


def _put_once(client: S3Client, bucket: str, key: str, body: bytes, content_type: str) -> bool:
    """Put ``key`` unless it exists; True when this call wrote it.

    ``If-None-Match: *`` makes the store itself refuse an overwrite.  A server that
    does not implement the condition gets a HEAD first: not atomic, but the keys
    here are new for every report, so only a retry of the same report can race it.
    """
    put: _Put = {
        "Bucket": bucket,
        "Key": key,
        "Body": body,
        "ContentType": content_type,
    }
    # Errors are told apart by the answer botocore attaches (``exc.response``), so the
    # pipeline imports no store library of its own.
    try:
        client.put_object(**put, IfNoneMatch="*")
        return True
    except Exception as exc:
        code = _error_code(exc)
        if code in _EXISTS:
            return False
        if code not in _UNSUPPORTED:
            raise
    try:
        client.head_object(Bucket=bucket, Key=key)
        return False
    except Exception as exc:
        if _error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
            raise
    client.put_object(**put)
    return True


def _error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError, or its HTTP status when it has none (a HEAD).

    Empty for any other exception, which the caller raises again.
    """
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return ""
    code = str(response.get("Error", {}).get("Code") or "")
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")
    return code if code and not code.isdigit() else status or code


def _location(settings: Settings) -> tuple[str, str] | None:
    """(bucket, prefix ending in '/' or empty) of the audit URL, or None when unset."""
    if not settings.audit_url:
        return None
    bucket, _, prefix = settings.audit_url.removeprefix("s3://").partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def _client(settings: Settings) -> S3Client:
    # Imported here: a deployment without an audit location never loads boto3.
    from digest_cleanup.kinds.s3_client import make_client

    return make_client(settings, max_attempts=WRITE_ATTEMPTS)
