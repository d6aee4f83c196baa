"""The conditional-delete probe of an S3 target: does the store honour ETag conditions?

Some S3-compatible servers ignore a delete's ETag condition without saying so,
and a delete that ignores it removes a key rewritten after it was listed.  So
the probe does not trust a version string: it writes probe objects in the
target's prefix (keys starting with :data:`PROBE_PREFIX`), asks for each one's
deletion with a stale ETag, looks whether it survived, then deletes it with its
own ETag and looks whether it is gone.  It does so on both delete paths the worker uses
(DeleteObjects with a per-object ``<ETag>``, and DeleteObject with ``If-Match``
for keys an XML body cannot carry), for a plain object and for a multipart one,
whose ETag has the form ``"hex-N"``.

The probe is the same code whether an operator runs ``digest-cleanup check`` or
a run's start runs it (see :func:`digest_cleanup.pipeline.lifecycle.start`).
It writes inside the target's prefix because that is where the workers' role may
write, read and delete; a probe object is never expired (it is younger than any
allowed cutoff), so no sweep deletes it.  Every probe object is removed afterwards
(every version of it in a versioned bucket), with a conditional delete, so a
bucket policy that refuses unconditional deletes does not refuse the cleanup.
Whether a probe object is still there is asked with ListObjectsV2, not HEAD: a
role whose ``s3:ListBucket`` is limited to prefixes gets 403, not 404, from a
HEAD of a missing key on AWS.

It needs ``s3:PutObject`` and ``s3:AbortMultipartUpload`` on
``PREFIX.digest-cleanup-check-*``, and the workers' own ``s3:GetObject``,
``s3:DeleteObject``, ``s3:DeleteObjectVersion``, ``s3:ListBucket`` and
``s3:ListBucketVersions`` on the prefix (see ``deploy/iam-policy.json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from digest_cleanup.errors import PermanentError, StoreError
from digest_cleanup.kinds.base import Finding
from digest_cleanup.kinds.s3_client import TRANSIENT_CODES, ErrorMapper, make_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef, ObjectTypeDef

    from digest_cleanup.kinds.s3_options import S3Options, S3Target

#: How a probe object's key starts, under the target's prefix.  A name, not a folder:
#: a filer-backed store (SeaweedFS) keeps an emptied folder, and the sweep would list it.
PROBE_PREFIX = ".digest-cleanup-check-"
#: An ETag no object has (the MD5 of nothing is d41d8cd9...; this is not it).
WRONG_ETAG = '"00000000000000000000000000000000"'
#: The same for a multipart object: a stale ETag of the form the listing gives.
WRONG_MULTIPART_ETAG = '"00000000000000000000000000000000-1"'
#: Attempts of each probe request: one throttle or dropped connection at a run's
#: start should not refuse the run, so the probe retries where the pipeline does not.
PROBE_ATTEMPTS = 4
#: Finding codes: a stale ETag deleted a probe object (unsafe deletes) ...
NOT_HONOURED = "conditions_not_honoured"
#: ... a matching ETag was refused (no key would ever be deleted) ...
REFUSED = "conditions_refused"
#: ... or the probe could not finish (permissions, the endpoint), so nothing is proved.
UNPROVEN = "conditions_unproven"

Path = Literal["DeleteObjects", "DeleteObject"]
#: The two delete paths of :mod:`digest_cleanup.kinds.s3_delete`.
PATHS: tuple[Path, ...] = ("DeleteObjects", "DeleteObject")


def probe_prefix(options: S3Options) -> str:
    """How a target's probe keys start: :data:`PROBE_PREFIX` under its prefix."""
    return f"{options.prefix}{PROBE_PREFIX}"


@dataclasses.dataclass
class _Trial:
    """One probe object taken through one delete path: a stale ETag, then its own."""

    path: Path
    multipart: bool
    kept_on_stale: bool = False
    #: The error the stale delete got: ``PreconditionFailed`` where conditions work.
    stale_code: str = ""
    deleted_on_match: bool = False

    @property
    def honoured(self) -> bool:
        return self.kept_on_stale and self.stale_code == "PreconditionFailed"

    @property
    def label(self) -> str:
        return f"{self.path}{' (multipart ETag)' if self.multipart else ''}"


def probe_conditional_deletes(kind: S3Target, mapped_errors: ErrorMapper) -> list[Finding]:
    """Prove, with probe objects under the target's prefix, that the store honours ETags.

    Returns a ``conditional deletes`` finding (both paths, plain objects), a
    ``multipart ETags`` finding, and a ``probe cleanup`` warning if a probe object
    could not be removed.  A problem finding carries one of the codes
    :data:`NOT_HONOURED`, :data:`REFUSED` or :data:`UNPROVEN`.
    """
    client = make_client(kind.settings, max_attempts=PROBE_ATTEMPTS)
    try:
        return _probe(kind, _Probe(client, kind.options.bucket, probe_prefix(kind.options),
                                   mapped_errors))  # fmt: skip
    finally:
        client.close()


def _probe(kind: S3Target, probe: _Probe) -> list[Finding]:
    opted_out = not kind.options.conditional_deletes
    needs = (
        f"needs s3:PutObject and s3:AbortMultipartUpload on {probe.where}*, and s3:GetObject, "
        f"s3:DeleteObject and s3:ListBucket on the prefix"
    )
    trials: list[_Trial] = []
    multipart_skipped = ""
    try:
        for multipart in (False, True):
            for path in PATHS:
                trial = _Trial(path, multipart)
                try:
                    probe.run(trial)
                except _MultipartUnavailable as exc:
                    multipart_skipped = str(exc)
                    break
                trials.append(trial)
    except StoreError as exc:
        detail = f"the probe could not finish: {exc.code}: {exc.message} ({needs})"
        return [Finding("conditional deletes", "problem", detail, UNPROVEN), *probe.cleanup()]
    findings = [
        _verdict("conditional deletes", [t for t in trials if not t.multipart], opted_out),
        (
            Finding(
                "multipart ETags",
                "warning",
                f"not probed: the endpoint did not create a multipart upload ({multipart_skipped})",
            )
            if multipart_skipped
            else _verdict("multipart ETags", [t for t in trials if t.multipart], opted_out)
        ),
    ]
    return [*findings, *probe.cleanup()]


def _verdict(name: str, trials: list[_Trial], opted_out: bool) -> Finding:
    """One finding for a set of trials: honoured, ignored, or refused even on a match."""
    ignored = [t.label for t in trials if not t.kept_on_stale]
    odd = [f"{t.label} ({t.stale_code or 'no error'})" for t in trials
           if t.kept_on_stale and not t.honoured]  # fmt: skip
    refused = [t.label for t in trials if t.honoured and not t.deleted_on_match]
    if ignored:
        advice = (
            "the target already sets conditional_deletes = false, so its deletes are unconditional"
            if opted_out
            else "a key rewritten after listing would be deleted. Use an endpoint that honours "
            "If-Match on delete, or, accepting that risk, set conditional_deletes = false on "
            "the target"
        )
        return Finding(
            name,
            "warning" if opted_out else "problem",
            f"NOT honoured by {', '.join(ignored)}: a delete with a stale ETag removed the "
            f"probe; {advice}",
            "" if opted_out else NOT_HONOURED,
        )
    if odd:
        return Finding(
            name,
            "problem",
            f"{', '.join(odd)} kept the probe on a stale ETag without answering "
            "PreconditionFailed, so a kept key could not be told from a failed delete",
            UNPROVEN,
        )
    if refused:
        return Finding(
            name,
            "problem",
            f"{', '.join(refused)} refused the probe even with its own ETag, so no key would "
            "ever be deleted (check s3:GetObject, which ETag conditions need)",
            REFUSED,
        )
    if opted_out:
        return Finding(
            name,
            "warning",
            "the endpoint honours ETag conditions, but the target sets conditional_deletes = "
            "false: a key rewritten after listing would be deleted; remove that line",
        )
    paths = " and ".join(t.label for t in trials)
    return Finding(
        name,
        "ok",
        f"honoured by {paths}: a stale ETag kept the probe (PreconditionFailed), "
        "and its own ETag deleted it",
    )


class _MultipartUnavailable(Exception):
    """The endpoint would not create a multipart upload; that part of the probe is skipped."""


def _unsupported(exc: StoreError) -> bool:
    """A refusal that retrying cannot change; 501 NotImplemented maps as transient (5xx)."""
    return isinstance(exc, PermanentError) or exc.code == "NotImplemented"


class _Probe:
    """The probe objects of one run of the probe, and their removal."""

    def __init__(
        self, client: S3Client, bucket: str, where: str, mapped_errors: ErrorMapper
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.where = where
        self.mapped_errors = mapped_errors
        #: Every probe key written, with the ETag to delete it by.
        self.written: dict[str, str] = {}

    def run(self, trial: _Trial) -> None:
        """Write one probe object and take it through ``trial``'s delete path."""
        key = f"{self.where}{uuid.uuid4().hex}"
        etag = self._write_multipart(key) if trial.multipart else self._write(key)
        stale = WRONG_MULTIPART_ETAG if trial.multipart else WRONG_ETAG
        trial.stale_code = self._delete(trial.path, key, stale)
        trial.kept_on_stale = self._exists(key)
        if not trial.kept_on_stale:
            return
        # The ETag the listing gives is what the worker sends, so match on that one.
        listed = self._listed_etag(key) or etag
        code = self._delete(trial.path, key, listed)
        trial.deleted_on_match = not code and not self._exists(key)

    def _write(self, key: str) -> str:
        with self.mapped_errors():
            etag = str(self.client.put_object(Bucket=self.bucket, Key=key, Body=b"probe")["ETag"])
        self.written[key] = etag
        return etag

    def _write_multipart(self, key: str) -> str:
        """A one-part multipart upload: its ETag is ``"hex-1"``, and it costs three requests."""
        try:
            with self.mapped_errors():
                upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)
        except StoreError as exc:
            if not _unsupported(exc):
                raise
            raise _MultipartUnavailable(f"{exc.code}: {exc.message}") from exc
        upload_id = upload["UploadId"]
        try:
            with self.mapped_errors():
                part = self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"probe"
                )
                done = self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
                )
        except StoreError as exc:
            # An incomplete upload is billed until it is aborted.
            with contextlib.suppress(StoreError), self.mapped_errors():
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            if _unsupported(exc):
                raise _MultipartUnavailable(f"{exc.code}: {exc.message}") from exc
            raise
        etag = str(done["ETag"])
        self.written[key] = etag
        return etag

    def _delete(self, path: Path, key: str, etag: str) -> str:
        """Delete ``key`` on ``etag`` by ``path``; the error code, or ``""`` if none."""
        if path == "DeleteObjects":
            for attempt in range(PROBE_ATTEMPTS):
                # botocore retries a throttled request, never a throttled key in a 200.
                time.sleep(0 if attempt == 0 else 0.2 * 2**attempt)
                with self.mapped_errors():
                    answer = self.client.delete_objects(
                        Bucket=self.bucket,
                        Delete={"Objects": [{"Key": key, "ETag": etag}], "Quiet": False},
                    )
                codes = [str(e.get("Code", "")) for e in answer.get("Errors", [])]
                if not codes or codes[0] not in TRANSIENT_CODES:
                    break
            return codes[0] if codes else ""
        try:
            with self.mapped_errors():
                self.client.delete_object(Bucket=self.bucket, Key=key, IfMatch=etag)
        except PermanentError as exc:
            if exc.code in ("PreconditionFailed", "412"):
                return "PreconditionFailed"
            raise
        return ""

    def _listing(self, key: str) -> Iterator[ObjectTypeDef]:
        with self.mapped_errors():
            answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        yield from (o for o in answer.get("Contents", []) if o["Key"] == key)

    def _exists(self, key: str) -> bool:
        # ListObjectsV2, not HEAD: see the module docstring.
        return any(True for _ in self._listing(key))

    def _listed_etag(self, key: str) -> str:
        return next((str(o.get("ETag", "")) for o in self._listing(key)), "")

    def cleanup(self) -> list[Finding]:
        """Remove every probe object and version; a warning naming what was left, if any."""
        left = [key for key in self.written if self._remove(key)]
        if not left:
            return []
        return [
            Finding(
                "probe cleanup",
                "warning",
                f"could not remove every version of the probe objects {left!r}; "
                f"delete them by hand (they are under {self.where!r})",
            )
        ]

    def _remove(self, key: str) -> str:
        """Delete a probe object (conditionally) and every version of it; what failed, or ``""``."""
        try:
            if self._exists(key):
                self._delete("DeleteObject", key, self._listed_etag(key) or self.written[key])
            with self.mapped_errors():
                listing = self.client.list_object_versions(Bucket=self.bucket, Prefix=key)
                versions: list[ObjectIdentifierTypeDef] = [
                    {"Key": v["Key"], "VersionId": v["VersionId"]}
                    for v in (*listing.get("Versions", []), *listing.get("DeleteMarkers", []))
                    if v["Key"] == key and v.get("VersionId") not in (None, "null")
                ]
                if versions:
                    self.client.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": versions, "Quiet": True}
                    )
        except StoreError as exc:
            return f"{exc.code}: {exc.message}"
        return ""
