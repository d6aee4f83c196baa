"""Deleting one batch from S3, every key accounted for: deleted, kept, or failed.

Deletes are conditional, so S3 itself makes the final check (see
:mod:`digest_cleanup.kinds.s3`).  Every key sent must come back as deleted or
as an error; a key the answer does not account for is looked up again, never
assumed gone.  A key that XML 1.0 cannot carry goes alone in a DeleteObject
request, whose key travels in the URL.

It is long because every way a delete can leave a key unconfirmed (a key the
answer leaves out, a ``PreconditionFailed``, a bare 404, a 403 to a look) is
settled here, in one place, by looking at the store.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Required, TypedDict

from botocore.exceptions import ClientError

from digest_cleanup.errors import PermanentError, StoreError, TransientError
from digest_cleanup.kinds.base import CHANGED_SINCE_LISTING, KeyResult, Outcome
from digest_cleanup.kinds.s3_client import TRANSIENT_CODES, aware, mapped_errors

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import (
        GetObjectOutputTypeDef,
        HeadObjectOutputTypeDef,
        ObjectIdentifierTypeDef,
        ObjectTypeDef,
    )

    from digest_cleanup.kinds.s3_options import S3Target

    #: What a look at a key found: a HEAD's headers, a GET's, or its listing entry.
    Look = HeadObjectOutputTypeDef | GetObjectOutputTypeDef | ObjectTypeDef

#: Separates key and version id in a ``versions = "all"`` key.  Version ids never
#: contain it, so ``rpartition`` splits correctly even when a key does.
VERSION_SEPARATOR = "?versionId="
#: Characters XML 1.0 cannot carry in a DeleteObjects body, plus the carriage
#: return, which the server's XML parser would read back as a line feed.
_NOT_XML_SAFE = re.compile("[^\t\n\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
#: Error codes that mean the object or version is not there (any more).  A bare 404,
#: without one of them, is not among them: any gateway or wrong path answers that.
GONE_CODES = frozenset({"NoSuchKey", "NoSuchVersion"})
#: The per-key code of a failed ETag condition.
PRECONDITION_FAILED = "PreconditionFailed"
#: The code botocore gives a 404 that named no S3 error code (every HEAD answer, whose
#: response has no body, and anything a proxy or wrong endpoint path sends).
BARE_NOT_FOUND = "404"
#: A 404 no S3 error code confirms: the key is not counted gone (a permanent failure).
NOT_FOUND_UNCONFIRMED = "not_found_unconfirmed"
#: What S3 answers a HEAD of a missing key with when the caller lacks s3:ListBucket on
#: the bucket as a whole (the deploy policy grants it per prefix only): 403, not 404.
FORBIDDEN_CODES = frozenset({"403", "AccessDenied", "Forbidden"})
#: A ``PreconditionFailed`` on an object that still has the listed ETag (permanent).
CONDITION_MISMATCH = "condition_mismatch"


class ObjectName(TypedDict, total=False):
    """How a request names one object: its S3 key, and for a version key its version."""

    Key: Required[str]
    VersionId: str


class IfMatch(TypedDict, total=False):
    """A DeleteObject's condition: the ETag the object must still have, when there is one."""

    IfMatch: str


class Deletion:
    """The delete path of one S3 target: a batch's requests and the lookups that settle it."""

    def __init__(self, kind: S3Target) -> None:
        self.kind = kind
        self.options = kind.options
        self._all_versions = kind.all_versions

    @property
    def client(self) -> S3Client:
        return self.kind.client

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        """Delete ``keys`` of the kind's target; one result per key, in order."""
        batch = Batch(keys, conditions if self.options.conditional_deletes else ())
        self._resolve_missing_conditions(batch, cutoff)
        self._refuse_null_versions(batch)
        self._send_open(batch, cutoff)
        return batch.results()

    def _send_open(self, batch: Batch, cutoff: datetime) -> None:
        """Send every key still open; the versioned path orders its requests here."""
        self._send(batch, batch.open())

    def _send(self, batch: Batch, indexes: list[int]) -> None:
        """Delete ``indexes`` of ``batch``: in one DeleteObjects, save keys XML cannot carry."""
        unsafe = [i for i in indexes if _NOT_XML_SAFE.search(self._key(batch.keys[i]))]
        in_body = [i for i in indexes if i not in unsafe]
        if in_body:
            self._delete_objects(batch, in_body)
        for index in unsafe:
            self._delete_one(batch, index)

    def _delete_objects(self, batch: Batch, indexes: list[int]) -> None:
        """One DeleteObjects request; every key must come back deleted or as an error."""
        objects = [self._identifier(batch.keys[i], batch.condition(i)) for i in indexes]
        sent = {(o["Key"], o.get("VersionId")): i for o, i in zip(objects, indexes, strict=True)}
        try:
            with mapped_errors():
                response = self.client.delete_objects(
                    Bucket=self.options.bucket, Delete={"Objects": objects, "Quiet": False}
                )
        except (TransientError, PermanentError) as exc:
            for i in indexes:
                batch.fail(i, exc)
            return
        for done in response.get("Deleted", []):
            version = done.get("VersionId")
            if version is None and self._all_versions:
                # A deleted delete marker: SeaweedFS names its version only here.
                version = done.get("DeleteMarkerVersionId")
            index = sent.get((done.get("Key", ""), version))
            if index is not None and index not in batch.done:
                batch.set(index, Outcome.DELETED)
        for err in response.get("Errors", []):
            index = sent.get((err.get("Key", ""), err.get("VersionId")))
            if index is not None and index not in batch.done:
                self._classify(batch, index, err.get("Code", "Unknown"), err.get("Message", ""))
        for index in indexes:  # not accounted for as sent: ask the store, never assume
            if index not in batch.done:
                self._recheck(batch, index, "unconfirmed", "the answer did not name this key")

    def _delete_one(self, batch: Batch, index: int) -> None:
        """DeleteObject for a key an XML body cannot carry: the key travels in the URL."""
        ident = self._name(batch.keys[index])
        condition = batch.condition(index)
        if_match: IfMatch = {"IfMatch": condition} if condition else {}
        try:
            with mapped_errors():
                self.client.delete_object(Bucket=self.options.bucket, **ident, **if_match)
        except (TransientError, PermanentError) as exc:
            self._classify(batch, index, exc.code, exc.message, exc)
            return
        except UnicodeError as exc:
            batch.set(index, Outcome.PERMANENT, "unencodable_key", str(exc))
            return
        batch.set(index, Outcome.DELETED)

    def _classify(
        self,
        batch: Batch,
        index: int,
        code: str,
        message: str,
        exc: StoreError | None = None,
    ) -> None:
        key = batch.keys[index]
        if code in GONE_CODES:
            batch.set(index, Outcome.DELETED)
        elif code == BARE_NOT_FOUND:
            batch.set(index, Outcome.PERMANENT, NOT_FOUND_UNCONFIRMED, _unconfirmed(message))
        elif code == PRECONDITION_FAILED:
            # Rewritten since the listing -- or already gone, which some servers
            # answer the same way: only a look tells the two apart.
            self._recheck(batch, index, PRECONDITION_FAILED, message)
        elif code == "AccessDenied" and self._all_versions and self._is_locked(key):
            batch.set(index, Outcome.PERMANENT, "locked", message or "object lock")
        elif code in TRANSIENT_CODES or isinstance(exc, TransientError):
            retry_after = exc.retry_after if exc is not None else None
            batch.set(index, Outcome.TRANSIENT, code, message, retry_after)
        else:
            batch.set(index, Outcome.PERMANENT, code, message)

    def _recheck(self, batch: Batch, index: int, code: str, message: str) -> None:
        """Settle an unconfirmed delete by looking: gone, changed since listing, or not.

        Only a look that shows another ETag makes a key ``changed_since_listing``;
        a ``PreconditionFailed`` on an object that still has its listed ETag is the
        endpoint comparing ETags differently, a permanent ``condition_mismatch``.
        """
        try:
            head = self._look(batch.keys[index])
        except (TransientError, PermanentError) as exc:
            if exc.code == NOT_FOUND_UNCONFIRMED:
                batch.set(index, Outcome.PERMANENT, exc.code, exc.message)
            else:
                batch.set(index, Outcome.TRANSIENT, code, f"{message}; lookup: {exc}")
            return
        if head is None:
            batch.set(index, Outcome.DELETED)
            return
        condition = batch.condition(index)
        if condition and not _same_etag(head.get("ETag", ""), condition):
            batch.set(
                index,
                Outcome.SKIPPED,
                CHANGED_SINCE_LISTING,
                f"rewritten since it was listed (ETag now {head.get('ETag', '?')}); kept",
            )
        elif code == PRECONDITION_FAILED:
            listed = f"the listed ETag {condition}" if condition else "no condition sent"
            batch.set(
                index,
                Outcome.PERMANENT,
                CONDITION_MISMATCH,
                f"the endpoint refused the delete as PreconditionFailed, yet the object "
                f"still has {listed}: it compares ETags in another form than it lists "
                f"them; kept. Run `digest-cleanup check {self.kind.name}`; if it finds "
                f"conditional deletes not honoured, set conditional_deletes = false on "
                f"the target, then redrive",
            )
        else:
            batch.set(index, Outcome.TRANSIENT, code, f"{message}; still present, retried")

    def _look(self, key: str) -> Look | None:
        """HEAD ``key``; ``None`` only when the store says it is gone with an S3 code.

        A HEAD answer has no body, so its 404 never carries ``NoSuchKey``: a GET,
        whose error body does, tells a key that is gone from a 404 that any
        gateway or wrong endpoint path sends, raised as ``not_found_unconfirmed``.
        """
        ident = self._name(key)
        try:
            with mapped_errors():
                return self.client.head_object(Bucket=self.options.bucket, **ident)
        except PermanentError as exc:
            if exc.code in GONE_CODES:
                return None
            if exc.code in FORBIDDEN_CODES and "VersionId" not in ident:
                return self._listed(key)
            if exc.code != BARE_NOT_FOUND:
                raise
        try:
            with mapped_errors():
                got = self.client.get_object(Bucket=self.options.bucket, **ident)
        except PermanentError as exc:
            if exc.code in GONE_CODES:
                return None
            if exc.code == BARE_NOT_FOUND:
                raise PermanentError(NOT_FOUND_UNCONFIRMED, _unconfirmed(exc.message)) from exc
            raise
        # Only its headers were wanted; the stubs call Body required, hence the ignore.
        got.pop("Body").close()  # type: ignore[misc]
        return got

    def _listed(self, key: str) -> ObjectTypeDef | None:
        """Look ``key`` up by listing it: what a role allowed to list only its prefix can do.

        A listing is S3's own answer, so a key it does not name is gone; one it names
        comes with its ETag, as a HEAD would.
        """
        with mapped_errors():
            page = self.client.list_objects_v2(Bucket=self.options.bucket, Prefix=key, MaxKeys=1)
        found = page.get("Contents") or []
        if found and found[0].get("Key") == key:
            return found[0].copy()
        return None

    def _resolve_missing_conditions(self, batch: Batch, cutoff: datetime) -> None:
        """Look up the ETag of a current-version key that came without one.

        Only a batch from before conditions existed, or a dead letter made then,
        lacks them.  The key is deleted on the ETag found, and only when the
        object found is older than the cutoff.
        """
        if self._all_versions or not self.options.conditional_deletes:
            return
        for index in batch.open():
            if batch.condition(index):
                continue
            try:
                head = self._look(batch.keys[index])
            except (TransientError, PermanentError) as exc:
                self._classify(batch, index, exc.code, exc.message, exc)
                continue
            if head is None:
                batch.set(index, Outcome.DELETED)
            elif aware(head["LastModified"]) >= cutoff:
                batch.set(
                    index,
                    Outcome.SKIPPED,
                    CHANGED_SINCE_LISTING,
                    f"last modified {head['LastModified']}, after the cutoff; kept",
                )
            else:
                batch.conditions[index] = str(head.get("ETag", ""))

    def _refuse_null_versions(self, batch: Batch) -> None:
        """Refuse ``null`` versions unless versioning is enabled (there they never change)."""
        if not self._all_versions:
            return
        null = [i for i in batch.open() if batch.keys[i].endswith(f"{VERSION_SEPARATOR}null")]
        if not null:
            return
        try:
            self.kind.require_versioning()
        except (TransientError, PermanentError) as exc:
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            for index in null:
                batch.set(index, outcome, exc.code, exc.message)

    def _identifier(self, key: str, condition: str = "") -> ObjectIdentifierTypeDef:
        if self._all_versions:
            base, _, version = key.rpartition(VERSION_SEPARATOR)
            return {"Key": base, "VersionId": version}
        return {"Key": key, "ETag": condition} if condition else {"Key": key}

    def _name(self, key: str) -> ObjectName:
        """:meth:`_identifier` without a condition: how HEAD, GET and DeleteObject name it."""
        if self._all_versions:
            base, _, version = key.rpartition(VERSION_SEPARATOR)
            return {"Key": base, "VersionId": version}
        return {"Key": key}

    def _key(self, key: str) -> str:
        return key.rpartition(VERSION_SEPARATOR)[0] if self._all_versions else key

    def _is_locked(self, key: str) -> bool:
        """Tell an Object Lock or legal hold apart from a plain AccessDenied."""
        ident = self._name(key)
        try:
            hold = self.client.get_object_legal_hold(Bucket=self.options.bucket, **ident)
            if hold.get("LegalHold", {}).get("Status") == "ON":
                return True
        except ClientError:
            pass
        try:
            retention = self.client.get_object_retention(Bucket=self.options.bucket, **ident)
            until = retention.get("Retention", {}).get("RetainUntilDate")
            return until is not None and aware(until) > datetime.now(UTC)
        except ClientError:
            return False


def _unconfirmed(message: str) -> str:
    """Why a 404 without an S3 error code is a failure, and the likely fix."""
    said = f" ({message})" if message and message != "Not Found" else ""
    return (
        f"the endpoint answered 404 without an S3 error code{said}, so the key is not "
        "known to be gone and is not counted deleted; S3 names a missing key NoSuchKey. "
        "CLEANUP_S3_ENDPOINT_URL likely points at the wrong host or path (a gateway or "
        "proxy that does not route to S3): fix it, then redrive"
    )


def _same_etag(found: str, listed: str) -> bool:
    """Whether two ETags name the same content, whatever quotes or case each came in."""
    return found.strip('"').lower() == listed.strip('"').lower()


class Batch:
    """One delete call's keys, their conditions, and what became of each so far."""

    def __init__(self, keys: Sequence[str], conditions: Sequence[str]) -> None:
        self.keys = list(keys)
        self.conditions = list(conditions) or [""] * len(self.keys)
        if len(self.conditions) != len(self.keys):
            raise ValueError(f"{len(self.conditions)} conditions for {len(self.keys)} keys")
        self.done: dict[int, KeyResult] = {}

    def condition(self, index: int) -> str:
        return self.conditions[index]

    def open(self) -> list[int]:
        return [i for i in range(len(self.keys)) if i not in self.done]

    def set(
        self,
        index: int,
        outcome: Outcome,
        code: str = "",
        message: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.done[index] = KeyResult(self.keys[index], outcome, code, message, retry_after)

    def fail(self, index: int, exc: StoreError) -> None:
        if exc.code == BARE_NOT_FOUND:  # the whole request reached something that is not S3
            self.set(index, Outcome.PERMANENT, NOT_FOUND_UNCONFIRMED, _unconfirmed(exc.message))
            return
        outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
        self.set(index, outcome, exc.code, exc.message, exc.retry_after)

    def results(self) -> list[KeyResult]:
        return [self.done[i] for i in range(len(self.keys))]
