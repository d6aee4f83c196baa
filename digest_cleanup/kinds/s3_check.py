"""``digest-cleanup check`` for S3 targets: what a first run relies on, proved with a probe.

Some S3-compatible servers ignore a delete's ETag condition without saying so,
and a delete that ignores it removes a key rewritten after it was listed.  So
the check does not trust a version string: it writes a probe object under
:data:`PROBE_PREFIX` (outside every target prefix), asks for its deletion with
a wrong ETag, and looks whether it survived.  The probe is removed afterwards,
every version of it in a versioned bucket.

The check needs, beyond the workers' own permissions, ``s3:PutObject``,
``s3:GetObject``, ``s3:DeleteObject``, ``s3:DeleteObjectVersion`` and
``s3:ListBucketVersions`` on the probe prefix (see ``deploy/iam-policy.json``).
"""

from __future__ import annotations

import uuid
from typing import Any

from digest_cleanup.errors import PermanentError, StoreError, TransientError
from digest_cleanup.kinds.base import Finding

#: Where the probe object lives: at the bucket's root, outside every target prefix.
PROBE_PREFIX = ".digest-cleanup-check/"
#: An ETag no object has (the MD5 of nothing is d41d8cd9...; this is not it).
WRONG_ETAG = '"00000000000000000000000000000000"'


def run_checks(kind: Any, mapped_errors: Any) -> list[Finding]:
    """Every finding for one S3 target; ``mapped_errors`` maps botocore's errors."""
    client, bucket, options = kind.client, kind.options.bucket, kind.options
    found: list[Finding] = []

    def attempt(check: str, call: Any, needs: str) -> Any:
        try:
            with mapped_errors():
                return call()
        except (TransientError, PermanentError) as exc:
            found.append(Finding(check, "problem", f"{exc.code}: {exc.message} ({needs})"))
            return None

    if (
        attempt("credentials and bucket", lambda: client.head_bucket(Bucket=bucket), _ACCESS)
        is None
    ):
        return found
    found.append(Finding("credentials and bucket", "ok", f"bucket {bucket!r} is reachable"))

    versioning = attempt(
        "versioning",
        lambda: client.get_bucket_versioning(Bucket=bucket),
        "needs s3:GetBucketVersioning",
    )
    if versioning is not None:
        found.append(_versioning(options, versioning.get("Status") or "never enabled"))

    listed = attempt(
        "listing",
        lambda: client.list_objects_v2(Bucket=bucket, Prefix=options.prefix, MaxKeys=1),
        f"needs s3:ListBucket for prefix {options.prefix!r}",
    )
    if listed is not None:
        found.append(Finding("listing", "ok", f"s3:ListBucket works for {kind.describe()}"))

    found.extend(_probe_conditional_deletes(kind, mapped_errors))
    return found


_ACCESS = "check the credentials (AWS_* or CLEANUP_S3_* settings), the endpoint and the bucket"


def _versioning(options: Any, status: str) -> Finding:
    if options.versions == "all" and status != "Enabled":
        return Finding(
            "versioning",
            "problem",
            f"versions = 'all' needs versioning enabled, and the bucket's is {status}; "
            "enable it, or set versions = 'current'",
        )
    if options.versions == "current" and status in ("Enabled", "Suspended"):
        return Finding(
            "versioning",
            "warning",
            f"versioning is {status}: deletes add delete markers and the old data stays as "
            "noncurrent versions; set versions = 'all' to remove those too",
        )
    return Finding("versioning", "ok", f"versioning is {status}, as versions = "
                   f"{options.versions!r} expects")  # fmt: skip


def _probe_conditional_deletes(kind: Any, mapped_errors: Any) -> list[Finding]:
    """Write a probe, delete it with a wrong ETag, and see whether the store kept it."""
    client, bucket = kind.client, kind.options.bucket
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    name = "conditional deletes"
    needs = f"needs s3:PutObject, s3:GetObject and s3:DeleteObject on {PROBE_PREFIX}*"
    try:
        with mapped_errors():
            etag = client.put_object(Bucket=bucket, Key=key, Body=b"probe")["ETag"]
            answer = client.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": key, "ETag": WRONG_ETAG}], "Quiet": False},
            )
            survived = _exists(client, bucket, key, mapped_errors)
            codes = {e.get("Code") for e in answer.get("Errors", [])}
            if survived:
                client.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": key, "ETag": etag}], "Quiet": False}
                )
                deleted_on_match = not _exists(client, bucket, key, mapped_errors)
    except StoreError as exc:
        return [Finding(name, "problem", f"{exc.code}: {exc.message} ({needs})")]
    finally:
        cleanup = _remove_probe(client, bucket, key, mapped_errors)
    findings = [_verdict(kind, survived, codes, deleted_on_match if survived else False)]
    if cleanup:
        findings.append(Finding("probe cleanup", "warning", cleanup))
    return findings


def _verdict(kind: Any, survived: bool, codes: set[Any], deleted_on_match: bool) -> Finding:
    name = "conditional deletes"
    opted_out = not kind.options.conditional_deletes
    if survived and "PreconditionFailed" in codes and deleted_on_match:
        if opted_out:
            return Finding(
                name,
                "warning",
                "the endpoint honours ETag conditions, but the target sets "
                "conditional_deletes = false: a key rewritten after listing would be deleted; "
                "remove that line",
            )
        return Finding(
            name,
            "ok",
            "honoured: a delete with a stale ETag kept the object (PreconditionFailed), "
            "and one with its ETag deleted it",
        )
    if survived and not deleted_on_match:
        return Finding(
            name,
            "problem",
            "the probe was refused even with its own ETag; the endpoint cannot delete "
            "conditionally (check s3:GetObject, which ETag conditions need)",
        )
    advice = (
        "the target already sets conditional_deletes = false, so its deletes are unconditional"
        if opted_out
        else "a key rewritten after listing would be deleted. Use an endpoint that honours "
        "If-Match on delete, or, accepting that risk, set conditional_deletes = false"
    )
    return Finding(
        name,
        "warning" if opted_out else "problem",
        f"NOT honoured: a delete with a stale ETag removed the probe; {advice}",
    )


def _exists(client: Any, bucket: str, key: str, mapped_errors: Any) -> bool:
    try:
        with mapped_errors():
            client.head_object(Bucket=bucket, Key=key)
    except PermanentError as exc:
        if exc.code in ("404", "NoSuchKey"):
            return False
        raise
    return True


def _remove_probe(client: Any, bucket: str, key: str, mapped_errors: Any) -> str:
    """Delete every version of the probe; return what was left, or ``""``."""
    try:
        with mapped_errors():
            client.delete_object(Bucket=bucket, Key=key)
            listing = client.list_object_versions(Bucket=bucket, Prefix=key)
            versions = [
                {"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in (*listing.get("Versions", []), *listing.get("DeleteMarkers", []))
                if v["Key"] == key and v.get("VersionId") not in (None, "null")
            ]
            if versions:
                client.delete_objects(Bucket=bucket, Delete={"Objects": versions, "Quiet": True})
    except StoreError as exc:
        return f"could not remove every version of the probe {key!r}: {exc.code}: {exc.message}"
    return ""
