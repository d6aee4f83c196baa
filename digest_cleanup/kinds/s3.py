"""The S3 kind: objects under a prefix, expired by LastModified, deleted with DeleteObjects.

With ``versions = "current"`` (the default) each key the pipeline carries is an
S3 key, and deleting it in a versioned bucket only adds a delete marker.  With
``versions = "all"`` it is a versioned key (``key?versionId=ID``) of an expired
key, and every version and delete marker of that key is deleted, so no
statement survives as a noncurrent version.  A key's versions travel in one
batch, and its delete markers go only once no data version of it is left
(:mod:`~digest_cleanup.kinds.s3_versions`), so a held version never becomes
current again.

Deletes are conditional, so S3 itself makes the final check:

* a current-version key carries the ETag its listing saw, and DeleteObjects
  sends it per object: a key rewritten since (a new ETag) fails with a per-key
  ``PreconditionFailed``, is kept and reported ``changed_since_listing``;
* a version key names exactly one immutable version by its id, which needs a
  bucket with versioning *enabled* (elsewhere the ``null`` version is rewritten in
  place, so ``versions = "all"`` refuses such a bucket);
* a key without an ETag is refused before it reaches S3 (``bad_condition``, see
  :meth:`S3Kind.condition_problem`), unless the target sends none at all.

Every key sent must come back as deleted or as an error.  A key the answer does
not account for is looked up again, never assumed gone.  A key that XML 1.0
cannot carry (control characters; a carriage return, which XML parsers turn into
a line feed) goes alone in a DeleteObject request, whose key travels in the URL.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from digest_cleanup.errors import PermanentError, TargetsFileError
from digest_cleanup.kinds import s3_shards
from digest_cleanup.kinds.base import Finding, KeyResult, Page, TargetKind, parse_dataclass
from digest_cleanup.kinds.s3_client import aware, make_client, mapped_errors
from digest_cleanup.kinds.s3_delete import VERSION_SEPARATOR, Deletion
from digest_cleanup.kinds.s3_options import S3Options as S3Options  # named beside the kind
from digest_cleanup.kinds.s3_versions import VersionedDeletion, scan_versions
from digest_cleanup.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: DeleteObjects takes at most this many keys per request.
DELETE_OBJECTS_LIMIT = 1000
#: Keys per ListObjectsV2 page: the most S3 returns, so the fewest round trips.
LIST_PAGE_SIZE = 1000
#: Keys per second a target on AWS S3 deletes unless it sets ``delete_rate``.  AWS
#: allows 3,500 writes per second per partitioned prefix and counts every key of a
#: DeleteObjects as one; this leaves a little for the renderer's own writes.
AWS_DELETE_RATE = 3300.0
#: Codes with which S3 (and S3-compatible servers) push back on the request rate.  A bare
#: 503 (no code in its body) and ServiceUnavailable count too: S3 documents its 503 as
#: "Slow Down", and backing off from an overloaded server is right whatever it says.
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "ServiceUnavailable",
        "503",
    }
)


#: What a delete condition must look like: a quoted hex digest (MD5 for a plain upload,
#: another digest under some encryptions), with ``-N`` for a multipart upload.  ``*``
#: means "any object" to S3, and an empty condition means none: both are refused.
ETAG_CONDITION = re.compile(r'"[0-9a-fA-F]{16,64}(-[0-9]{1,5})?"')


class S3Kind(TargetKind):
    """Objects in one bucket under one prefix."""

    name = "s3"
    Options = S3Options
    max_batch_size: ClassVar[int] = DELETE_OBJECTS_LIMIT
    throttle_codes: ClassVar[frozenset[str]] = THROTTLE_CODES
    options: S3Options

    def __init__(self, target: str, options: S3Options, settings: Settings) -> None:
        super().__init__(target, options, settings)
        self._lock = threading.Lock()
        self._client: S3Client | None = None
        #: The last ``Date`` header S3 sent, with the monotonic time it arrived.
        self._server_date: tuple[datetime, float] | None = None

    @classmethod
    def parse_options(cls, target: str, raw: Mapping[str, Any]) -> S3Options:
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
        if opts.prefix and not opts.prefix.endswith("/") and opts.prefix_is_folder:
            raise TargetsFileError(
                f"targets.{target}.prefix: {opts.prefix!r} does not end in '/', so it also "
                f"matches sibling folders such as '{opts.prefix}-archive/'; add a trailing "
                f"slash, or set prefix_is_folder = false if you mean every key that starts "
                f"with {opts.prefix!r}"
            )
        return opts

    @classmethod
    def default_delete_rate(cls, options: S3Options, settings: Settings) -> float:
        """:data:`AWS_DELETE_RATE` on AWS S3; no budget on another endpoint, whose limits
        AWS's figure says nothing about (set ``delete_rate`` there if it has one)."""
        endpoint = settings.s3_endpoint_url
        host = (urlsplit(endpoint).hostname or "") if endpoint else "s3.amazonaws.com"
        return AWS_DELETE_RATE if host.endswith(".amazonaws.com") else 0.0

    @property
    def client(self) -> S3Client:
        """One client per process: boto3 clients are thread-safe but not fork-safe."""
        with self._lock:
            if self._client is None:
                self._client = make_client(self.settings)
                self._client.meta.events.register("after-call.s3", self._note_date)
            return self._client

    def _note_date(self, http_response: object = None, **_: object) -> None:
        """Keep the store's clock from each answer's ``Date`` header (see :meth:`server_time`)."""
        raw = getattr(http_response, "headers", {}).get("Date") if http_response else None
        if not raw:
            return
        try:
            self._server_date = (parsedate_to_datetime(raw), time.monotonic())
        except (TypeError, ValueError):
            return

    def server_time(self) -> datetime | None:
        """S3's clock: the last ``Date`` header, advanced by the time since it arrived.

        ``Date`` has whole seconds, so S3's clock read somewhere in the second after it;
        this is the end of that second.  A store whose clock is truly behind still pulls
        the trusted now back, but its header's rounding alone never refuses a cutoff
        that this host and Redis agree has passed.
        """
        seen = self._server_date
        if seen is None:
            return None
        date, at = seen
        return date + timedelta(seconds=1 + time.monotonic() - at)

    def condition_problem(self, condition: str) -> str | None:
        if self.all_versions or not self.options.conditional_deletes:
            # A version key names its version; an unconditional target sends nothing.
            return None if not condition else "a condition for a target that sends none"
        if not ETAG_CONDITION.fullmatch(condition):
            shown = condition[:40] or "an empty condition"
            return (
                f"{shown!r} is not an ETag (a quoted hex digest, with -N for a multipart "
                "upload); S3 would read '*' as any object, and no condition as none"
            )
        return None

    def prepare(self) -> None:
        # Building a client loads botocore's service model (about 0.2 s of CPU in a
        # fresh process); done at start, it is off the first batch's path.  No request
        # is sent.
        _ = self.client

    def describe(self) -> str:
        return f"s3://{self.options.bucket}/{self.options.prefix}"

    def check(self) -> list[Finding]:
        from digest_cleanup.kinds import s3_check

        return s3_check.run_checks(self, mapped_errors)

    def probe_conditions(self) -> list[Finding]:
        """The ETag probe of ``check``, for a target whose deletes send listed ETags."""
        if self.all_versions or not self.options.conditional_deletes:
            return []  # a version id names what is deleted; an opted-out target sends none
        from digest_cleanup.kinds import s3_probe

        return s3_probe.probe_conditional_deletes(self, mapped_errors)

    @classmethod
    def namespace(cls, options: S3Options) -> tuple[str, str]:
        return f"s3://{options.bucket}", options.prefix

    def scope(self) -> dict[str, Any]:
        # Not the endpoint: hosts of one deployment may reach the same store by other
        # URLs (a VPC endpoint, a relay), and their batches must still be accepted.
        # conditional_deletes is in: a worker that would drop the listed ETags deletes
        # differently from the one that listed, so it refuses the batch instead.
        return {
            "kind": self.name,
            "bucket": self.options.bucket,
            "prefix": self.options.prefix,
            "versions": self.options.versions,
            "conditional_deletes": self.options.conditional_deletes,
        }

    @property
    def conditional(self) -> bool:
        return bool(self.options.conditional_deletes) or self.all_versions

    def out_of_scope(self, key: str) -> str | None:
        if self.all_versions and VERSION_SEPARATOR not in key:
            return "not a versioned key (key?versionId=ID), but the target deletes all versions"
        base = key.rpartition(VERSION_SEPARATOR)[0] if self.all_versions else key
        if not base:
            return "empty key"
        if not base.startswith(self.options.prefix):
            return f"outside the target prefix {self.options.prefix!r}"
        return None

    @property
    def all_versions(self) -> bool:
        """True when a key is one version of a key (``versions = "all"``)."""
        return bool(self.options.versions == "all")

    def group(self, key: str) -> str:
        """With ``versions = "all"``, the S3 key: its versions and markers go in one batch."""
        base, separator, _ = key.rpartition(VERSION_SEPARATOR)
        return base if self.all_versions and separator else key

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        # Listing errors reach the sweep as TransientError or PermanentError.
        with mapped_errors():
            if self.all_versions:
                yield from scan_versions(self, cutoff, start_after)
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
            old = [o for o in contents if aware(o["LastModified"]) < cutoff]
            yield Page(
                scanned=len(contents),
                expired=[o["Key"] for o in old],
                cursor=cursor,
                conditions=[o.get("ETag", "") for o in old] if conditional else [],
            )

    def require_versioning(self) -> None:
        """Raise unless the bucket's versioning is enabled (``versions = "all"`` needs it)."""
        with mapped_errors():
            versioning = self.client.get_bucket_versioning(Bucket=self.options.bucket)
        # Optional, whatever the stubs say: S3 sends no Status for a bucket whose
        # versioning was never enabled.
        status: str | None = versioning.get("Status")
        if status != "Enabled":
            raise PermanentError(
                "versioning_not_enabled",
                f"targets.{self.target}.versions = 'all' needs versioning enabled on bucket "
                f"{self.options.bucket!r} (it is {status or 'never enabled'}): there an "
                "overwrite replaces the null version in place, so no delete can be bound to "
                "what was listed; enable versioning, or set versions = 'current'",
            )

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        """Delete a batch, every key accounted for (see :mod:`~digest_cleanup.kinds.s3_delete`).

        With ``versions = "all"`` a key's delete markers go only after its data versions
        (see :mod:`~digest_cleanup.kinds.s3_versions`).
        """
        deletion = VersionedDeletion(self) if self.all_versions else Deletion(self)
        return deletion.delete(keys, cutoff, conditions)

    def remaining(self, cutoff: datetime) -> int:
        """Expired keys still present, listed by botocore's stock client and paginator.

        Not through :meth:`scan`: a fault in the sweep's listing (its lean page
        reader, its sharding) would then hide what it failed to list from the very
        check meant to catch it.  With ``versions = "all"`` the scan already lists
        with botocore's paginator and parser (the lean reader reads ListObjectsV2
        only), and its grouping of versions is what decides what expired.
        """
        if self.all_versions:
            return sum(len(page.expired) for page in self.scan(cutoff))
        paginator = self.verify_client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.options.bucket, Prefix=self.options.prefix)
        count = 0
        with mapped_errors():
            for response in s3_shards.listed(pages, self.options.prefix):
                contents = response.get("Contents", [])
                count += sum(1 for o in contents if aware(o["LastModified"]) < cutoff)
        return count

    @functools.cached_property
    def verify_client(self) -> S3Client:
        """A client without the lean listing reader, for ``verify`` (see :meth:`remaining`)."""
        return make_client(self.settings, lean_listing=False)

    def verify_extra(self, cutoff: datetime) -> dict[str, int]:
        """Noncurrent versions and delete markers under the prefix (versioned buckets)."""
        versioning = self.verify_client.get_bucket_versioning(Bucket=self.options.bucket)
        if versioning.get("Status") not in ("Enabled", "Suspended"):
            return {}
        noncurrent = 0
        paginator = self.verify_client.get_paginator("list_object_versions")
        for response in paginator.paginate(Bucket=self.options.bucket, Prefix=self.options.prefix):
            noncurrent += sum(1 for v in response.get("Versions", []) if not v.get("IsLatest"))
            noncurrent += len(response.get("DeleteMarkers", []))
        return {"noncurrent_versions": noncurrent}

    def close(self) -> None:
        with self._lock:
            self._client = None
