"""What the demo seeds (expired and fresh statements, receipts), and the target that cleans it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from digest_cleanup.demo.seed import create_bucket, digest_layout_keys, seed_keys
from digest_cleanup.targets import DEFAULT_BATCH_SIZE

#: The bucket of the demo, the same name as in the compose stack's targets file.
DEFAULT_BUCKET = "digest-artifacts"
#: Where run reports go; a second bucket, as in production.
AUDIT_BUCKET = "digest-audit"
#: The target the demo runs, and its prefix.
TARGET = "statements"
PREFIX = "statements/"
#: Outside the target's prefix: as old as the expired statements, and never deleted.
OUTSIDE_PREFIX = "receipts/"
#: Shares of the seeded artifacts that are fresh statements and receipts; the rest
#: are expired statements (120k: 110,000 expired, 6,000 fresh, 4,000 receipts).
FRESH_SHARE = 1 / 20
OUTSIDE_SHARE = 1 / 30
#: Keys per batch: the targets file's default, which the demo keeps (it sets none).
BATCH_SIZE = DEFAULT_BATCH_SIZE
#: How long a real deployment keeps the statements.  Here it only names the weeks in
#: the keys: S3 stamps every object "now", so the demo's target keeps nothing
#: (``retention_days = 0``) and the run's cutoff is taken between the uploads.
RETENTION_DAYS = 35


@dataclass(frozen=True)
class Seeded:
    """What :func:`seed_artifacts` wrote, and the cutoff that separates expired from fresh."""

    cutoff: datetime
    expired: int
    fresh: int
    outside: int

    @property
    def total(self) -> int:
        """Every artifact seeded, whatever its kind."""
        return self.expired + self.fresh + self.outside


def split_counts(count: int) -> tuple[int, int, int]:
    """``count`` artifacts as (expired statements, fresh statements, receipts)."""
    fresh = int(count * FRESH_SHARE)
    outside = int(count * OUTSIDE_SHARE)
    return count - fresh - outside, fresh, outside


def seed_artifacts(endpoint: str, bucket: str, count: int, *, versioned: bool = False) -> Seeded:
    """Seed ``count`` artifacts into ``bucket`` and return the cutoff between old and fresh.

    S3 stamps LastModified itself at upload, at one-second precision, so "expired"
    means uploaded before the cutoff: the statements and receipts go first, the
    cutoff is the next second, and the fresh statements go once the clock passed it.
    """
    expired, fresh, outside = split_counts(count)
    today = datetime.now(UTC).date()
    old_week = (today - timedelta(days=RETENTION_DAYS + 7)).isoformat()
    create_bucket(endpoint, bucket, versioning=versioned, exist_ok=True)
    seed_keys(
        endpoint,
        bucket,
        digest_layout_keys(PREFIX, expired, old_week)
        + digest_layout_keys(OUTSIDE_PREFIX, outside, old_week),
    )
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < cutoff + timedelta(milliseconds=50):
        time.sleep(0.05)  # waiting for the wall clock itself to pass the cutoff
    seed_keys(endpoint, bucket, digest_layout_keys(PREFIX, fresh, today.isoformat()))
    return Seeded(cutoff=cutoff, expired=expired, fresh=fresh, outside=outside)


def targets_toml(bucket: str) -> str:
    """The targets file of the demo: one target over the statements in ``bucket``."""
    return (
        f"[targets.{TARGET}]\n"
        'description = "Rendered weekly statements (demo)."\n'
        f'bucket = "{bucket}"\n'
        f'prefix = "{PREFIX}"\n'
        # Every demo object is written moments ago (S3 stamps LastModified itself), so the
        # run's cutoff falls between the uploads, which only a zero retention allows.
        "retention_days = 0\n"
        'schedule = "0 3 * * 0"\n'
    )
