"""A batch message that can never succeed: dead-lettered as poison, counted in no run.

A message that does not decode (or decodes into nonsense) is never retried, and
moves no run's counters: nothing in it can be proven to be what a run published,
so a forged one naming a real batch must not end that batch.  The sweep's own
messages always decode, so a run never waits on a poison one of its own.
"""

from __future__ import annotations

import logging
from typing import Any

from digest_cleanup.errors import PoisonMessage
from digest_cleanup.logs import log_event
from digest_cleanup.model.batches import BatchReport
from digest_cleanup.model.dead_letters import make_poison_entry
from digest_cleanup.pipeline.runtime import Runtime

logger = logging.getLogger("digest_cleanup.batch")


def poison_batch(runtime: Runtime, raw: Any, task_id: str, poison: PoisonMessage) -> BatchReport:
    """Dead-letter a message that can never succeed; it counts in no run (see the module)."""
    letter = make_poison_entry(task_id, raw, poison.code, poison.message)
    runtime.dispatcher.send_dead_letter(letter)
    entry_id, kwargs = letter.entry_id, letter.body
    report = BatchReport(
        status="poison",
        run_id=kwargs["run_id"],
        target=kwargs["target"],
        batch_id=kwargs["dead_letter"]["batch_id"],
        entry_id=entry_id,
        reason=poison.code,
        dead_lettered=kwargs["dead_letter"]["item_count"],
    )
    log_event(logger, "batch", runtime.settings, level=logging.WARNING, **report.as_dict())
    return report
