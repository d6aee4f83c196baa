"""The S3 kind: objects under a prefix, expired by LastModified, deleted with DeleteObjects.

With ``versions = "current"`` (the default) an item is a key, and deleting it in a
versioned bucket only adds a delete marker.  With ``versions = "all"`` an item is
one version (``key?versionId=ID``) of an expired key, and every version and delete
marker of that key is deleted, so no statement survives as a noncurrent version.

Deletes are conditional, so S3 itself makes the final check:

* a current-version item carries the ETag its listing saw, and DeleteObjects
  sends it per object: a key rewritten since (a new ETag) fails with a per-key
  ``PreconditionFailed``, is kept and reported ``changed_since_listing``;
* a version item names exactly one immutable version by its id, which needs a
  bucket with versioning *enabled* (elsewhere the ``null`` version is rewritten in
  place, so ``versions = "all"`` refuses such a bucket);
* an item without an ETag (a batch from before conditions existed) is looked up
  first, and deleted on the ETag found only if it is older than the cutoff.

Every key sent must come back as deleted or as an error.  A key the answer does
not account for is looked up again, never assumed gone.  A key that XML 1.0
cannot carry (control characters; a carriage return, which XML parsers turn into
a line feed) goes alone in a DeleteObject request, whose key travels in the URL.
"""

from __future__ import annotations

import dataclasses
import re
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

from digest_cleanup.config.settings import Settings
from digest_cleanup.errors import ItemError, PermanentError, TargetsFileError, TransientError
from digest_cleanup.kinds import s3_listing, s3_shards
from digest_cleanup.kinds.base import (
    CHANGED_SINCE_LISTING,
    Finding,
    ItemResult,
    Outcome,
    Page,
    TargetKind,
    parse_dataclass,
)

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
#: Characters XML 1.0 cannot carry in a DeleteObjects body, plus the carriage
#: return, which the server's XML parser would read back as a line feed.
_NOT_XML_SAFE = re.compile("[^\t\n\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
#: Error codes that mean the object or version is not there (any more).
GONE_CODES = frozenset({"NoSuchKey", "NoSuchVersion", "404"})
#: The per-key code of a failed ETag condition.
PRECONDITION_FAILED = "PreconditionFailed"
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
    #: Send each key's listed ETag with its delete, so S3 keeps a key rewritten since.
    #: Turn off only for a server that refuses the condition (``digest-cleanup check``).
    conditional_deletes: bool = True


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

    def check(self) -> list[Finding]:
        from digest_cleanup.kinds import s3_check

        return s3_check.run_checks(self, _mapped_errors)

    @classmethod
    def namespace(cls, options: S3Options) -> tuple[str, str]:
        return f"s3://{options.bucket}", options.prefix

    def scope(self) -> dict[str, Any]:
        # Not the endpoint: hosts of one deployment may reach the same store by other
        # URLs (a VPC endpoint, a relay), and their batches must still be accepted.
        # Not conditional_deletes either: it changes how a key is deleted, not which.
        return {
            "kind": self.name,
            "bucket": self.options.bucket,
            "prefix": self.options.prefix,
            "versions": self.options.versions,
        }

    @property
    def conditional(self) -> bool:
        return bool(self.options.conditional_deletes) or self._all_versions

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
        conditional = self.options.conditional_deletes
        for contents, cursor in listing:
            old = [o for o in contents if _aware(o["LastModified"]) < cutoff]
            yield Page(
                scanned=len(contents),
                expired=[o["Key"] for o in old],
                cursor=cursor,
                conditions=[o.get("ETag", "") for o in old] if conditional else [],
            )

    def _scan_versions(self, cutoff: datetime, start_after: str | None) -> Iterator[Page]:
        """Group versions by key; a key expires when its newest data version is old."""
        self._require_versioning()
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

    def delete(
        self, items: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[ItemResult]:
        batch = _Batch(items, conditions if self.options.conditional_deletes else ())
        self._resolve_missing_conditions(batch, cutoff)
        self._refuse_null_versions(batch)
        unsafe = [i for i in batch.open() if _NOT_XML_SAFE.search(self._key(batch.items[i]))]
        in_body = [i for i in batch.open() if i not in unsafe]
        if in_body:
            self._delete_objects(batch, in_body)
        for index in unsafe:
            self._delete_one(batch, index)
        return batch.results()

    def _delete_objects(self, batch: _Batch, indexes: list[int]) -> None:
        """One DeleteObjects request; every key must come back deleted or as an error."""
        objects = [self._identifier(batch.items[i], batch.condition(i)) for i in indexes]
        sent = {(o["Key"], o.get("VersionId")): i for o, i in zip(objects, indexes, strict=True)}
        try:
            with _mapped_errors():
                response = self.client.delete_objects(
                    Bucket=self.options.bucket, Delete={"Objects": objects, "Quiet": False}
                )
        except (TransientError, PermanentError) as exc:
            for i in indexes:
                batch.fail(i, exc)
            return
        for done in response.get("Deleted", []):
            index = sent.get((done.get("Key", ""), done.get("VersionId")))
            if index is not None and index not in batch.done:
                batch.set(index, Outcome.DELETED)
        for err in response.get("Errors", []):
            index = sent.get((err.get("Key", ""), err.get("VersionId")))
            if index is not None and index not in batch.done:
                self._classify(batch, index, err.get("Code", "Unknown"), err.get("Message", ""))
        for index in indexes:  # not accounted for as sent: ask the store, never assume
            if index not in batch.done:
                self._recheck(batch, index, "unconfirmed", "the answer did not name this key")

    def _delete_one(self, batch: _Batch, index: int) -> None:
        """DeleteObject for a key an XML body cannot carry: the key travels in the URL."""
        ident = self._identifier(batch.items[index], "")
        condition = batch.condition(index)
        if condition:
            ident["IfMatch"] = condition
        try:
            with _mapped_errors():
                self.client.delete_object(Bucket=self.options.bucket, **ident)
        except (TransientError, PermanentError) as exc:
            self._classify(batch, index, exc.code, exc.message, exc)
            return
        except UnicodeError as exc:
            batch.set(index, Outcome.PERMANENT, "unencodable_key", str(exc))
            return
        batch.set(index, Outcome.DELETED)

    def _classify(
        self,
        batch: _Batch,
        index: int,
        code: str,
        message: str,
        exc: ItemError | None = None,
    ) -> None:
        item = batch.items[index]
        if code in GONE_CODES:
            batch.set(index, Outcome.DELETED)
        elif code == PRECONDITION_FAILED:
            # Rewritten since the listing -- or already gone, which some servers
            # answer the same way: only a look tells the two apart.
            self._recheck(batch, index, PRECONDITION_FAILED, message)
        elif code == "AccessDenied" and self._all_versions and self._is_locked(item):
            batch.set(index, Outcome.PERMANENT, "locked", message or "object lock")
        elif code in TRANSIENT_CODES or isinstance(exc, TransientError):
            retry_after = exc.retry_after if exc is not None else None
            batch.set(index, Outcome.TRANSIENT, code, message, retry_after)
        else:
            batch.set(index, Outcome.PERMANENT, code, message)

    def _recheck(self, batch: _Batch, index: int, code: str, message: str) -> None:
        """Settle an unconfirmed delete by looking: gone, changed since listing, or retry."""
        ident = self._identifier(batch.items[index], "")
        try:
            with _mapped_errors():
                head = self.client.head_object(Bucket=self.options.bucket, **ident)
        except (TransientError, PermanentError) as exc:
            if exc.code in GONE_CODES:
                batch.set(index, Outcome.DELETED)
            else:
                batch.set(index, Outcome.TRANSIENT, code, f"{message}; lookup: {exc}")
            return
        condition = batch.condition(index)
        if code == PRECONDITION_FAILED or (condition and head.get("ETag") != condition):
            batch.set(
                index,
                Outcome.SKIPPED,
                CHANGED_SINCE_LISTING,
                f"rewritten since it was listed (ETag now {head.get('ETag', '?')}); kept",
            )
        else:
            batch.set(index, Outcome.TRANSIENT, code, f"{message}; still present, retried")

    def _resolve_missing_conditions(self, batch: _Batch, cutoff: datetime) -> None:
        """Look up the ETag of a current-version item that came without one.

        Only a batch from before conditions existed, or a dead letter made then,
        lacks them.  The item is deleted on the ETag found, and only when the
        object found is older than the cutoff.
        """
        if self._all_versions or not self.options.conditional_deletes:
            return
        for index in batch.open():
            if batch.condition(index):
                continue
            try:
                with _mapped_errors():
                    head = self.client.head_object(
                        Bucket=self.options.bucket, Key=batch.items[index]
                    )
            except (TransientError, PermanentError) as exc:
                if exc.code in GONE_CODES:
                    batch.set(index, Outcome.DELETED)
                else:
                    self._classify(batch, index, exc.code, exc.message, exc)
                continue
            if _aware(head["LastModified"]) >= cutoff:
                batch.set(
                    index,
                    Outcome.SKIPPED,
                    CHANGED_SINCE_LISTING,
                    f"last modified {head['LastModified']}, after the cutoff; kept",
                )
            else:
                batch.conditions[index] = str(head.get("ETag", ""))

    def _refuse_null_versions(self, batch: _Batch) -> None:
        """Refuse ``null`` versions unless versioning is enabled (there they never change)."""
        if not self._all_versions:
            return
        null = [i for i in batch.open() if batch.items[i].endswith(f"{VERSION_SEPARATOR}null")]
        if not null:
            return
        try:
            self._require_versioning()
        except (TransientError, PermanentError) as exc:
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            for index in null:
                batch.set(index, outcome, exc.code, exc.message)

    def _require_versioning(self) -> None:
        """Raise unless the bucket's versioning is enabled (``versions = "all"`` needs it)."""
        with _mapped_errors():
            status = self.client.get_bucket_versioning(Bucket=self.options.bucket).get("Status")
        if status != "Enabled":
            raise PermanentError(
                "versioning_not_enabled",
                f"targets.{self.target}.versions = 'all' needs versioning enabled on bucket "
                f"{self.options.bucket!r} (it is {status or 'never enabled'}): there an "
                "overwrite replaces the null version in place, so no delete can be bound to "
                "what was listed; enable versioning, or set versions = 'current'",
            )

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

    def _identifier(self, item: str, condition: str = "") -> dict[str, str]:
        if self._all_versions:
            key, _, version = item.rpartition(VERSION_SEPARATOR)
            return {"Key": key, "VersionId": version}
        return {"Key": item, "ETag": condition} if condition else {"Key": item}

    def _key(self, item: str) -> str:
        return item.rpartition(VERSION_SEPARATOR)[0] if self._all_versions else item

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


class _Batch:
    """One delete call's items, their conditions, and what became of each so far."""

    def __init__(self, items: Sequence[str], conditions: Sequence[str]) -> None:
        self.items = list(items)
        self.conditions = list(conditions) or [""] * len(self.items)
        if len(self.conditions) != len(self.items):
            raise ValueError(f"{len(self.conditions)} conditions for {len(self.items)} items")
        self.done: dict[int, ItemResult] = {}

    def condition(self, index: int) -> str:
        return self.conditions[index]

    def open(self) -> list[int]:
        return [i for i in range(len(self.items)) if i not in self.done]

    def set(
        self,
        index: int,
        outcome: Outcome,
        code: str = "",
        message: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.done[index] = ItemResult(self.items[index], outcome, code, message, retry_after)

    def fail(self, index: int, exc: ItemError) -> None:
        outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
        self.set(index, outcome, exc.code, exc.message, exc.retry_after)

    def results(self) -> list[ItemResult]:
        return [self.done[i] for i in range(len(self.items))]


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
