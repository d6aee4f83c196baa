"""Redrive and purge as operators ask for them, with the results they are shown.

The CLI (``dlq redrive``, ``dlq purge``) and the console both act through these
two functions, so a click in the browser moves, refuses and audits exactly what
the same command would: the dry run asks :func:`~digest_cleanup.ops.redrive_checks.refusal`
for every entry, the real one goes through
:func:`~digest_cleanup.ops.redrive_checks.redrive`, and a purge leaves its audit
records in Redis and at the audit location.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from digest_cleanup.audit import reports
from digest_cleanup.clock import now_iso
from digest_cleanup.model.dead_letters import Entry
from digest_cleanup.ops import redrive_checks as redrive
from digest_cleanup.pipeline.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class RedriveResult:
    """What a redrive (or its dry run) moved or would move, and what it refused, with why."""

    dry_run: bool
    selected: list[str]
    #: The entries that moved (empty on a dry run) or, on a dry run, would move.
    movable: list[str]
    refused: list[redrive.Refusal]
    #: Keys of the movable entries.
    keys: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "selected": self.selected,
            "redriven": [] if self.dry_run else self.movable,
            "would_redrive": self.movable if self.dry_run else [],
            "refused": [dataclasses.asdict(r) for r in self.refused],
            "keys": self.keys,
        }


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


def redrive_entries(runtime: Runtime, entries: Sequence[Entry], *, dry_run: bool) -> RedriveResult:
    """Move ``entries`` back onto the work queue, or on a dry run say which would move."""
    if dry_run:
        refusals = [r for e in entries if (r := redrive.refusal(runtime, e)) is not None]
        refused_ids = {r.entry_id for r in refusals}
        movable = [e.id for e in entries if e.id not in refused_ids]
    else:
        outcome = redrive.redrive(runtime, runtime.dead_letters, entries)
        refusals, movable = outcome.refused, outcome.moved
    keys = sum(len(e.keys) for e in entries if e.id in movable)
    return RedriveResult(dry_run, [e.id for e in entries], movable, refusals, keys)


def purge_entries(runtime: Runtime, entries: Sequence[Entry], command: str) -> PurgeResult:
    """Drop ``entries`` for good; ``command`` (who asked, and how) goes into each audit record."""
    records = runtime.dead_letters.purge(entries, command)
    # Redis keeps the audit records; the audit location keeps them for good.
    kept = reports.write_purge(runtime.settings, now_iso(), records)
    return PurgeResult(records, kept)
