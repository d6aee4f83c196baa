"""What happens when a run ends: the audit report, the target's last success, the log line.

The report (a summary, plus one line for every item that was not deleted and
why) goes to the audit location, see :mod:`digest_cleanup.pipeline.audit`.  It is the
durable record: Redis state ages out, and a Redis restart may lose it sooner.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from digest_cleanup.logs import log_event
from digest_cleanup.pipeline import audit
from digest_cleanup.pipeline.runs import now_iso
from digest_cleanup.pipeline.runtime import Runtime

logger = logging.getLogger("digest_cleanup.run")


def finish_run(runtime: Runtime, run_id: str) -> dict[str, Any]:
    """Write the report and mark the target's last success; safe to call more than once."""
    store = runtime.store
    run = store.get(run_id)
    summary = run.as_dict()
    target = summary["target"]
    if run.status == "complete" and not summary.get("dry_run"):
        store.mark_success(target)
    summary["retries_by_code"] = store.retry_codes(run_id)
    summary["accounting"] = {
        "expired": summary["expired"],
        "deleted_plus_dead_lettered_plus_skipped": summary["deleted"]
        + summary["dead_lettered"]
        + summary["skipped"],
        "balanced": summary["expired"]
        == summary["deleted"] + summary["dead_lettered"] + summary["skipped"],
    }
    not_deleted = list(_not_deleted(runtime, run_id))
    summary["not_deleted_count"] = len(not_deleted)
    try:
        url = audit.write_report(runtime.settings, target, run_id, summary, not_deleted)
    except Exception as exc:  # the run's outcome stands; only its report waits
        return _report_pending(runtime, run_id, summary, exc)
    if url:
        summary["report_url"] = url
    summary["report_pending"] = False
    summary.pop("report_error", None)
    # Written last: waiters treat a run as done once its report is out too.
    store.update(run_id, report_url=url or "", finalized_at=now_iso(), report_pending=0)
    store.clear(run_id, "report_error")
    store.expire(run_id)
    log_event(
        logger,
        "run",
        runtime.settings,
        run_id=run_id,
        status=run.status,
        expired=summary["expired"],
        deleted=summary["deleted"],
        dead_lettered=summary["dead_lettered"],
        skipped=summary["skipped"],
        duration=_duration(summary),
        reason=summary.get("reason", "-"),
        dry_run=summary.get("dry_run", False),
        report=url or "-",
    )
    return summary


def _report_pending(
    runtime: Runtime, run_id: str, summary: dict[str, Any], exc: Exception
) -> dict[str, Any]:
    """Keep the run in its final state with the report marked pending, and say why.

    Nothing was counted by the attempt to write it, so writing it later (``runs
    report RUN``, or the run's next trigger) counts nothing again.
    """
    error = f"{type(exc).__name__}: {exc}"[:500]
    runtime.store.update(run_id, report_pending=1, report_error=error, finalized_at=now_iso())
    runtime.store.expire(run_id)
    log_event(logger, "run", runtime.settings, level=logging.WARNING, run_id=run_id,
              status=summary["status"], report="pending", error=error)  # fmt: skip
    return {**summary, "report_pending": True, "report_error": error}


def _duration(summary: dict[str, Any]) -> float | str:
    """Seconds from the run's creation to its end, for the log line; ``-`` if unknown."""
    try:
        start = datetime.fromisoformat(summary["created_at"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(summary["ended_at"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return "-"
    return round((end - start).total_seconds(), 3)


def _not_deleted(runtime: Runtime, run_id: str) -> Any:
    """Every item the run did not delete: kept on purpose first, then dead letters."""

    for kept in runtime.store.skipped_items(run_id):
        yield {**kept, "reason": "skipped", "entry_id": ""}

    for entry in runtime.dead_letters.entries(run=run_id):
        data = entry.as_dict()
        for key in data["keys"]:
            yield {
                "key": key["key"],
                "code": key["code"],
                "message": key["message"],
                "reason": data["reason"],
                "entry_id": data["id"],
            }
