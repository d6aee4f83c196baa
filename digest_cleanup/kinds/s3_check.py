"""``digest-cleanup check`` for S3 targets: what a run relies on, proved against the store.

Credentials and the bucket, versioning against ``versions``, listing under the
prefix, and the conditional-delete probe of :mod:`digest_cleanup.kinds.s3_probe`,
the same probe a run's start runs (see :func:`digest_cleanup.pipeline.lifecycle.start`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from digest_cleanup.errors import PermanentError, TransientError
from digest_cleanup.kinds.base import Finding
from digest_cleanup.kinds.s3_probe import probe_conditional_deletes

if TYPE_CHECKING:
    from digest_cleanup.kinds.s3_client import ErrorMapper
    from digest_cleanup.kinds.s3_options import S3Options, S3Target

#: What one checked call answers.
T = TypeVar("T")


def run_checks(kind: S3Target, mapped_errors: ErrorMapper) -> list[Finding]:
    """Every finding for one S3 target; ``mapped_errors`` maps botocore's errors."""
    client, bucket, options = kind.client, kind.options.bucket, kind.options
    found: list[Finding] = []

    def attempt(check: str, call: Callable[[], T], needs: str) -> T | None:
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
        # Optional, whatever the stubs say: a bucket never versioned answers no Status.
        status: str | None = versioning.get("Status")
        found.append(_versioning(options, status or "never enabled"))

    listed = attempt(
        "listing",
        lambda: client.list_objects_v2(Bucket=bucket, Prefix=options.prefix, MaxKeys=1),
        f"needs s3:ListBucket for prefix {options.prefix!r}",
    )
    if listed is not None:
        found.append(Finding("listing", "ok", f"s3:ListBucket works for {kind.describe()}"))

    found.extend(probe_conditional_deletes(kind, mapped_errors))
    return found


_ACCESS = "check the credentials (AWS_* or CLEANUP_S3_* settings), the endpoint and the bucket"


def _versioning(options: S3Options, status: str) -> Finding:
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
