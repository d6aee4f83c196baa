"""Redrive: which dead-letter entries may go back onto the work queue, and moving them.

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

from digest_cleanup.errors import ConfigError, RefusedBatch
from digest_cleanup.model.dead_letters import Entry
from digest_cleanup.pipeline.batch_checks import check_batch
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.store.dead_letters import DeadLetterQueue


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why one entry was not moved."""

    entry_id: str
    reason: str
    message: str


@dataclasses.dataclass
class Outcome:
    """What a redrive did: the entries moved, and the ones it refused with why."""

    moved: list[str] = dataclasses.field(default_factory=list)
    refused: list[Refusal] = dataclasses.field(default_factory=list)


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


def redrive(runtime: Runtime, queue: DeadLetterQueue, entries: Iterable[Entry]) -> Outcome:
    """Move every entry that passes :func:`refusal`; go on past the ones that do not."""
    outcome = Outcome()
    for entry in entries:
        refused = refusal(runtime, entry)
        if refused is not None:
            outcome.refused.append(refused)
        elif queue.redrive_one(entry):
            outcome.moved.append(entry.id)
    return outcome
