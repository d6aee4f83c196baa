"""What happens when a run ends: the audit report, the target's last success, the log line.

The report goes to ``CLEANUP_AUDIT_URL`` (``s3://bucket/prefix/``) as
``TARGET/RUN_ID/summary.json`` plus ``TARGET/RUN_ID/not_deleted.jsonl``, one line
for every item that was not deleted and why.  It is the durable record: Redis
state ages out, and a Redis restart may lose it sooner.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from digest_cleanup.logs import log_event
from digest_cleanup.runs import now_iso
from digest_cleanup.runtime import Runtime

logger = logging.getLogger("digest_cleanup.run")


def finish_run(runtime: Runtime, run_id: str) -> dict[str, Any]:
    """Write the report and mark the target's last success; safe to call more than once."""
    store = runtime.store
    run = store.get(run_id)
    summary = run.as_dict()
    target = summary["target"]
    if run.status == "complete" and not summary.get("dry_run"):
        store.redis.set(store.key("target", target, "last_success"), now_iso())
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
    url = write_report(runtime, target, run_id, summary, not_deleted)
    if url:
        summary["report_url"] = url
    # Written last: waiters treat a run as done once its report is out too.
    store.update(run_id, report_url=url or "", finalized_at=now_iso())
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
        reason=summary.get("reason", "-"),
        dry_run=summary.get("dry_run", False),
        report=url or "-",
    )
    return summary


def _not_deleted(runtime: Runtime, run_id: str) -> Any:
    from digest_cleanup.app import dead_letter_queue

    for entry in dead_letter_queue(runtime).entries():
        if entry.run_id != run_id:
            continue
        data = entry.as_dict()
        for key in data["keys"]:
            yield {
                "key": key["key"],
                "code": key["code"],
                "message": key["message"],
                "reason": data["reason"],
                "entry_id": data["id"],
            }


def write_report(
    runtime: Runtime, target: str, run_id: str, summary: dict[str, Any], rows: list[dict[str, Any]]
) -> str | None:
    """Put the report objects under the audit URL; returns its location, or None if unset."""
    audit = runtime.settings.audit_url
    if not audit:
        return None
    from digest_cleanup.kinds.s3 import make_client

    bucket, _, prefix = audit.removeprefix("s3://").partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    base = f"{prefix}{target}/{run_id}/"
    client = make_client(runtime.settings, max_attempts=5)
    client.put_object(
        Bucket=bucket,
        Key=base + "summary.json",
        Body=json.dumps(summary, indent=2, sort_keys=True).encode(),
        ContentType="application/json",
    )
    client.put_object(
        Bucket=bucket,
        Key=base + "not_deleted.jsonl",
        Body="".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode(),
        ContentType="application/x-ndjson",
    )
    return f"s3://{bucket}/{base}"
