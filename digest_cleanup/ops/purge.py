"""Purge: drop dead-letter entries for good, leaving an audit record of each.

The CLI (``dlq purge``) and the console both act through :func:`purge_entries`,
so a purge from the browser drops and audits exactly what the same command
would: the records go to Redis and to the audit location.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from digest_cleanup.audit import reports
from digest_cleanup.clock import now_iso
from digest_cleanup.model.dead_letters import Entry
from digest_cleanup.pipeline.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class PurgeResult:
    """The audit records of the entries a purge dropped, and where they were kept for good."""

    records: list[dict[str, Any]]
    #: The audit location's copy, or None when ``CLEANUP_AUDIT_URL`` is unset.
    audit_url: str | None

    @property
    def purged(self) -> list[str]:
        return [r["entry"]["id"] for r in self.records]

    def as_dict(self) -> dict[str, Any]:
        return {"purged": self.purged, "audit_records": self.records, "audit_url": self.audit_url}


def purge_entries(runtime: Runtime, entries: Sequence[Entry], command: str) -> PurgeResult:
    """Drop ``entries`` for good; ``command`` (who asked, and how) goes into each audit record."""
    records = runtime.dead_letters.purge(entries, command)
    # Redis keeps the audit records; the audit location keeps them for good.
    kept = reports.write_purge(runtime.settings, now_iso(), records)
    return PurgeResult(records, kept)
