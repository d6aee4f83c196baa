"""The audit location: where run reports are kept for good.

``CLEANUP_AUDIT_URL`` is an ``s3://bucket/prefix/`` location, whatever kind the
target is: the report of a PostgreSQL run goes to S3 too.  Each run writes
``TARGET/RUN_ID/summary.json`` and ``TARGET/RUN_ID/not_deleted.jsonl`` there.
The writer lives here, apart from :mod:`digest_cleanup.pipeline.lifecycle`, so that the code
that ends runs never touches a storage client of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from digest_cleanup.config.settings import Settings

#: Attempts per report object.  A run's report is written once, at its end, so
#: unlike deletes it is retried in place rather than by the pipeline.
WRITE_ATTEMPTS = 5


def write_report(
    settings: Settings,
    target: str,
    run_id: str,
    summary: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
) -> str | None:
    """Put one run's report under the audit URL; return its location, or None if unset."""
    location = _location(settings)
    if location is None:
        return None
    bucket, prefix = location
    base = f"{prefix}{target}/{run_id}/"
    client = _client(settings)
    client.put_object(
        Bucket=bucket,
        Key=base + "summary.json",
        Body=json.dumps(summary, indent=2, sort_keys=True).encode(),
        ContentType="application/json",
    )
    client.put_object(
        Bucket=bucket,
        Key=base + "not_deleted.jsonl",
        Body="".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode(),
        ContentType="application/x-ndjson",
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
    key = f"{prefix}{folder}/{at.replace(':', '')}.json"
    _client(settings).put_object(
        Bucket=bucket,
        Key=key,
        Body=json.dumps(list(records), indent=2, sort_keys=True).encode(),
        ContentType="application/json",
    )
    return f"s3://{bucket}/{key}"


def _location(settings: Settings) -> tuple[str, str] | None:
    """(bucket, prefix ending in '/' or empty) of the audit URL, or None when unset."""
    if not settings.audit_url:
        return None
    bucket, _, prefix = settings.audit_url.removeprefix("s3://").partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def _client(settings: Settings) -> Any:
    # Imported here: a deployment without an audit location never loads boto3.
    from digest_cleanup.kinds.s3_client import make_client

    return make_client(settings, max_attempts=WRITE_ATTEMPTS)
