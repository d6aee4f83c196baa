"""The S3 kind: objects under a prefix, expired by LastModified, deleted with DeleteObjects.

With ``versions = "current"`` (the default) an item is a key, and deleting it in a
versioned bucket only adds a delete marker.  With ``versions = "all"`` an item is
one version (``key?versionId=ID``) of an expired key, and every version and delete
marker of that key is deleted, so no statement survives as a noncurrent version.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

import boto3
import botocore.handlers
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from digest_cleanup.errors import PermanentError, TargetsFileError, TransientError
from digest_cleanup.kinds import s3_listing, s3_shards
from digest_cleanup.kinds.base import ItemResult, Outcome, Page, TargetKind, parse_dataclass
from digest_cleanup.settings import Settings

#: DeleteObjects takes at most this many keys per request.
DELETE_OBJECTS_LIMIT = 1000
#: Keys per ListObjectsV2 page: the most S3 returns, so the fewest round trips.
LIST_PAGE_SIZE = 1000
#: Connections the one client of a process keeps for reuse.  A worker in the threads
#: pool runs one delete per thread at once, and a pool smaller than that opens and
#: drops a connection for every batch past it; connections open on demand, so a
#: prefork child holds one.
CONNECTIONS_PER_CLIENT = 64
#: Separates key and version id in a ``versions = "all"`` item.  Version ids never
#: contain it, so ``rpartition`` splits correctly even when a key does.
VERSION_SEPARATOR = "?versionId="
#: Per-key and per-request error codes worth retrying.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "OperationAborted",
        "500",
        "502",
        "503",
        "504",
    }
)


@dataclasses.dataclass(frozen=True)
class S3Options:
    """Fields of an S3 target."""

    bucket: str
    prefix: str
    #: An empty prefix means the whole bucket; it must be asked for by name.
    allow_whole_bucket: bool = False
    #: ``current``: delete the current version (versioned buckets gain delete markers);
    #: ``all``: delete every version and delete marker of an expired key.
    versions: Literal["current", "all"] = "current"


class S3Kind(TargetKind):
    """Objects in one bucket under one prefix."""

    name = "s3"
    Options = S3Options
    max_batch_size: ClassVar[int] = DELETE_OBJECTS_LIMIT

    def __init__(self, target: str, options: S3Options, settings: Settings) -> None:
        super().__init__(target, options, settings)
        self._lock = threading.Lock()
        self._client: Any = None

    @classmethod
    def parse_options(cls, target: str, raw: Any) -> S3Options:
        opts: S3Options = parse_dataclass(S3Options, target, raw)
        if not opts.bucket:
            raise TargetsFileError(f"targets.{target}.bucket: must not be empty")
        if not opts.prefix and not opts.allow_whole_bucket:
            raise TargetsFileError(
                f"targets.{target}.prefix: an empty prefix means the whole bucket "
                f"{opts.bucket!r}; set a prefix such as 'statements/', or add "
                "allow_whole_bucket = true if you really mean every object"
            )
        if opts.prefix and opts.allow_whole_bucket:
            raise TargetsFileError(
                f"targets.{target}.allow_whole_bucket: only meaningful with prefix = ''; remove it"
            )
        return opts

    @property
    def client(self) -> Any:
        """One client per process: boto3 clients are thread-safe but not fork-safe."""
        with self._lock:
            if self._client is None:
                self._client = make_client(self.settings)
            return self._client

    def prepare(self) -> None:
        # Building a client loads botocore's service model (about 0.2 s of CPU in a
        # fresh process); done at start, it is off the first batch's path.  No request
        # is sent.
        _ = self.client

    def describe(self) -> str:
        return f"s3://{self.options.bucket}/{self.options.prefix}"

    def out_of_scope(self, item: str) -> str | None:
        key = item.rpartition(VERSION_SEPARATOR)[0] if self._all_versions else item
        if self._all_versions and VERSION_SEPARATOR not in item:
            return "not a key?versionId=ID item, but the target deletes all versions"
        if not key:
            return "empty key"
        if not key.startswith(self.options.prefix):
            return f"outside the target prefix {self.options.prefix!r}"
        return None

    @property
    def _all_versions(self) -> bool:
        return bool(self.options.versions == "all")

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        # Listing errors reach the sweep as TransientError or PermanentError.
        with _mapped_errors():
            if self._all_versions:
                yield from self._scan_versions(cutoff, start_after)
            else:
                yield from self._scan_current(cutoff, start_after)

    def _scan_current(self, cutoff: datetime, start_after: str | None) -> Iterator[Page]:
        # Weekly folders under the prefix are listed several at a time; the cursor
        # is then the kind's own (see s3_shards), opaque to the sweep as always.
        listing = s3_shards.pages(
            self.client, self.options.bucket, self.options.prefix, start_after, LIST_PAGE_SIZE
        )
        for contents, cursor in listing:
            expired = [o["Key"] for o in contents if _aware(o["LastModified"]) < cutoff]
            yield Page(scanned=len(contents), expired=expired, cursor=cursor)

    def _scan_versions(self, cutoff: datetime, start_after: str | None) -> Iterator[Page]:
        """Group versions by key; a key expires when its newest data version is old."""
        params: dict[str, Any] = {"Bucket": self.options.bucket, "Prefix": self.options.prefix}
        if start_after:
            params["KeyMarker"] = start_after
        paginator = self.client.get_paginator("list_object_versions")
        key: str | None = None
        group: list[dict[str, Any]] = []
        for response in paginator.paginate(**params):
            entries = [
                *({**v, "marker": False} for v in response.get("Versions", [])),
                *({**m, "marker": True} for m in response.get("DeleteMarkers", [])),
            ]
            entries.sort(key=lambda e: e["Key"])  # stable: keeps each key's newest-first order
            expired: list[str] = []
            done_key: str | None = None
            for entry in entries:
                if entry["Key"] != key:
                    if key is not None:
                        expired.extend(_expired_versions(key, group, cutoff))
                        done_key = key
                    key, group = entry["Key"], []
                group.append(entry)
            yield Page(scanned=len(entries), expired=expired, cursor=done_key)
        if key is not None:
            yield Page(scanned=0, expired=_expired_versions(key, group, cutoff), cursor=key)

    def delete(self, items: Sequence[str], cutoff: datetime) -> list[ItemResult]:
        objects = [self._identifier(item) for item in items]
        by_identity = {
            (o["Key"], o.get("VersionId")): item for o, item in zip(objects, items, strict=True)
        }
        try:
            with _mapped_errors():
                response = self.client.delete_objects(
                    Bucket=self.options.bucket, Delete={"Objects": objects, "Quiet": True}
                )
        except (TransientError, PermanentError) as exc:
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            return [ItemResult(i, outcome, exc.code, exc.message, exc.retry_after) for i in items]
        failed: dict[str, ItemResult] = {}
        for err in response.get("Errors", []):
            item = by_identity.get((err.get("Key", ""), err.get("VersionId")))
            if item is None:
                item = by_identity.get((err.get("Key", ""), None))
            if item is None:
                continue
            code = err.get("Code", "Unknown")
            message = err.get("Message", "")
            if code == "AccessDenied" and self._all_versions and self._is_locked(item):
                failed[item] = ItemResult(
                    item, Outcome.PERMANENT, "locked", message or "object lock"
                )
            elif code in TRANSIENT_CODES:
                failed[item] = ItemResult(item, Outcome.TRANSIENT, code, message)
            else:
                failed[item] = ItemResult(item, Outcome.PERMANENT, code, message)
        return [failed.get(i) or ItemResult(i, Outcome.DELETED) for i in items]

    def remaining(self, cutoff: datetime) -> int:
        return sum(len(page.expired) for page in self.scan(cutoff))

    def verify_extra(self, cutoff: datetime) -> dict[str, int]:
        """Noncurrent versions and delete markers under the prefix (versioned buckets)."""
        versioning = self.client.get_bucket_versioning(Bucket=self.options.bucket)
        if versioning.get("Status") not in ("Enabled", "Suspended"):
            return {}
        noncurrent = 0
        paginator = self.client.get_paginator("list_object_versions")
        for response in paginator.paginate(Bucket=self.options.bucket, Prefix=self.options.prefix):
            noncurrent += sum(1 for v in response.get("Versions", []) if not v.get("IsLatest"))
            noncurrent += len(response.get("DeleteMarkers", []))
        return {"noncurrent_versions": noncurrent}

    def close(self) -> None:
        with self._lock:
            self._client = None

    def _identifier(self, item: str) -> dict[str, str]:
        if self._all_versions:
            key, _, version = item.rpartition(VERSION_SEPARATOR)
            return {"Key": key, "VersionId": version}
        return {"Key": item}

    def _is_locked(self, item: str) -> bool:
        """Tell an Object Lock or legal hold apart from a plain AccessDenied."""
        ident = self._identifier(item)
        try:
            hold = self.client.get_object_legal_hold(Bucket=self.options.bucket, **ident)
            if hold.get("LegalHold", {}).get("Status") == "ON":
                return True
        except ClientError:
            pass
        try:
            retention = self.client.get_object_retention(Bucket=self.options.bucket, **ident)
            until = retention.get("Retention", {}).get("RetainUntilDate")
            return until is not None and _aware(until) > datetime.now(UTC)
        except ClientError:
            return False


def _expired_versions(key: str, group: list[dict[str, Any]], cutoff: datetime) -> list[str]:
    data = [e for e in group if not e["marker"]]
    newest = max((_aware(e["LastModified"]) for e in data), default=None)
    if newest is not None and newest >= cutoff:
        return []
    return [f"{key}{VERSION_SEPARATOR}{e['VersionId']}" for e in group]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _fast_timestamp(value: str) -> datetime:
    """botocore's default parser goes through dateutil, a hot spot in big listings."""
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        from botocore.utils import parse_timestamp

        parsed: datetime = parse_timestamp(value)
        return parsed


def make_client(settings: Settings, *, max_attempts: int = 1) -> Any:
    """An S3 client for these settings.

    Retries are the pipeline's job (task-level backoff that frees the worker and
    honours ``Retry-After``), so deletes go out with a single attempt.  Its
    ListObjectsV2 pages carry ``Key`` and ``LastModified`` only (see
    :mod:`digest_cleanup.kinds.s3_listing`).
    """
    core = botocore.session.get_session()
    core.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=_fast_timestamp
    )
    session = boto3.Session(
        botocore_session=core,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
        aws_session_token=settings.aws_session_token,
        region_name=settings.aws_region or "us-east-1",
        profile_name=settings.aws_profile,
    )
    config = Config(
        # total_max_attempts counts the first attempt; botocore's max_attempts key counts
        # retries only, so max_attempts=1 meant a hidden retry of every throttled delete.
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=5,
        read_timeout=60,
        max_pool_connections=CONNECTIONS_PER_CLIENT,
        s3={"addressing_style": "path"} if settings.s3_endpoint_url else None,
    )
    client = session.client("s3", endpoint_url=settings.s3_endpoint_url, config=config)
    # Listing is the guard pass's cost, and it comes before the first delete.
    s3_listing.install(
        client, _fast_timestamp, getattr(botocore.handlers, "_handle_200_error", None)
    )
    return client


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """Map botocore's errors to the pipeline's transient/permanent classes."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        code = str(error.get("Code") or meta.get("HTTPStatusCode") or "Unknown")
        message = str(error.get("Message") or "")
        retry_after = _retry_after(meta.get("HTTPHeaders", {}))
        status = int(meta.get("HTTPStatusCode") or 0)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            raise TransientError(code, message, retry_after=retry_after) from exc
        raise PermanentError(code, message) from exc
    except (ConnectTimeoutError, ReadTimeoutError) as exc:
        raise TransientError("timeout", str(exc)) from exc
    except (EndpointConnectionError, ConnectionClosedError) as exc:
        raise TransientError("connection_error", str(exc)) from exc
    except BotoCoreError as exc:
        raise TransientError("client_error", str(exc)) from exc


def _retry_after(headers: dict[str, str]) -> float | None:
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None
