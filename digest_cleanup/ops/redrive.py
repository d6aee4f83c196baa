"""Redrive: check dead-letter entries again, and move the ones that pass back onto the work queue.

The CLI (``dlq redrive``) and the console both act through :func:`redrive_entries`,
so a click in the browser moves, refuses and reports exactly what the same
command would.

A redrive is a delete that runs again, possibly weeks after its run, so it is
checked here first, against this process's own targets file, clock and run
store, with the same rules a worker applies to every batch:

* the entry decoded as a batch (a poison entry cannot be redriven);
* its target still exists, with the scope the entry was listed under;
* its cutoff lies outside the target's retention window;
* its run is still in the run store, in the incarnation that listed it, was not
  aborted, and published exactly these keys and conditions for the batch.

An entry that fails a check is not moved: it stays where it is, with all its
keys, and the reason is reported, so nothing is turned into a lesser entry or
lost.  The worker checks again on delivery; checking first only keeps a
redrive from being refused after the fact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from digest_cleanup.errors import ConfigError, RefusedBatch
from digest_cleanup.model.dead_letters import Entry
from digest_cleanup.pipeline.batch_checks import check_batch
from digest_cleanup.pipeline.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why one entry was not moved."""

    entry_id: str
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class RedriveResult:
    """What a redrive (or its dry run) moved or would move, and what it refused, with why."""

    dry_run: bool
    selected: list[str]
    #: The entries that moved or, on a dry run, would move.
    movable: list[str]
    refused: list[Refusal]
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


def refusal(runtime: Runtime, entry: Entry) -> Refusal | None:
    """Why ``entry`` must not be redriven now, or None when it may.

    The checks are the worker's own (:func:`~digest_cleanup.pipeline.batch_checks.check_batch`),
    so a redrive is refused for exactly what its delivery would be refused for.
    """
    if entry.payload is None:
        return Refusal(
            entry.id,
            "poison",
            "the message never decoded as a batch; inspect it with 'dlq show' and purge it",
        )
    try:
        check_batch(runtime, entry.payload, redriving=True)
    except RefusedBatch as refused:
        return Refusal(entry.id, refused.code, refused.message)
    except ConfigError as exc:  # a kind that cannot be built here, such as a missing DSN
        return Refusal(entry.id, "unknown_target", f"{exc}; fix the configuration, then redrive")
    return None


def redrive_entries(runtime: Runtime, entries: Iterable[Entry], *, dry_run: bool) -> RedriveResult:
    """Move every entry that passes :func:`refusal`, going on past the ones that do not.

    Entries are checked and moved one at a time, as ``entries`` yields them, so a
    redrive that dies part way leaves each entry in exactly one queue.  On a dry
    run nothing moves: the result says which entries would.
    """
    queue = runtime.dead_letters
    selected: list[str] = []
    movable: list[str] = []
    refusals: list[Refusal] = []
    keys = 0
    for entry in entries:
        selected.append(entry.id)
        refused = refusal(runtime, entry)
        if refused is not None:
            refusals.append(refused)
        elif dry_run or queue.redrive_one(entry):
            movable.append(entry.id)
            keys += len(entry.keys)
    return RedriveResult(dry_run, selected, movable, refusals, keys)
