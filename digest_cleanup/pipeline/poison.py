"""A batch message that can never succeed: dead-lettered as poison, and ended if it is real.

A message that does not decode (or decodes into nonsense) is never retried.  If
its fields still name an in-flight batch of the current run incarnation, the
batch is recorded as dead-lettered, or its run would wait for it forever.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from digest_cleanup.errors import PoisonMessage
from digest_cleanup.logs import log_event
from digest_cleanup.pipeline.batches import BatchRecord, BatchReport
from digest_cleanup.pipeline.dead_letter import make_poison_entry
from digest_cleanup.pipeline.runtime import Runtime

logger = logging.getLogger("digest_cleanup.batch")


def poison_batch(runtime: Runtime, raw: Any, task_id: str, poison: PoisonMessage) -> BatchReport:
    """Dead-letter a message that can never succeed; account it if it is a real batch of a run."""
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
    # A genuine batch that got corrupted must still end, or its run would wait for
    # it forever; one of another incarnation, or a forged one, counts nothing.
    raw_map: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    run = runtime.store.find(report.run_id) if report.run_id else None
    if (
        run is not None
        and report.batch_id
        and run.fields.get("token", "") == raw_map.get("run_token")
        and runtime.store.is_in_flight(report.run_id, report.batch_id)
    ):
        report.recorded = runtime.store.record(
            report.run_id,
            report.target,
            BatchRecord(
                batch_id=report.batch_id,
                claim=f"{report.batch_id}/poison/g{raw_map.get('generation', 0)}"
                f"a{raw_map.get('attempt', 0)}",
                dead_lettered=report.dead_lettered,
                codes={poison.code: report.dead_lettered},
                first_generation=raw_map.get("generation", 0) == 0,
            ),
        )
        if report.recorded == "finished":
            from digest_cleanup.pipeline.lifecycle import finish_run

            finish_run(runtime, report.run_id)
    log_event(logger, "batch", runtime.settings, level=logging.WARNING, **report.as_dict())
    return report
