"""A run's start and its end: opening it and sending its sweep; the report when it ends.

A run starts with :func:`start` (from beat's trigger or the CLI), which opens it
in the run store and sends its first sweep slice.  A target's first run, and its
first after its scope changes, proves first that the store honours delete
conditions (the probe of ``digest-cleanup check``), and is refused otherwise.  It ends with
:func:`finish_run`: the audit report, the target's last success, the log line.

The report (a summary, plus one line for every key that was not deleted and
why) goes to the audit location, see :mod:`digest_cleanup.audit.reports`.  It is the
durable record: Redis state ages out, and a Redis restart may lose it sooner.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime
from typing import Any, Literal

from digest_cleanup.audit import reports
from digest_cleanup.clock import epoch_of, now_iso
from digest_cleanup.errors import ConfigError
from digest_cleanup.kinds import Finding, TargetKind
from digest_cleanup.logs import log_event
from digest_cleanup.model.run_view import FINAL_STATUSES
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.trusted_clock import trusted_now
from digest_cleanup.targets import Target

logger = logging.getLogger("digest_cleanup.run")

#: The reason of a run refused because the conditions probe could not finish.
UNPROVEN = "conditions_unproven"

#: A sweep that has not checkpointed for the visibility timeout plus this long is stalled.
STALL_MARGIN_SECONDS = 30.0


def run_id_for(target: str, cutoff: datetime, *, dry_run: bool = False) -> str:
    """Deterministic: the same target and cutoff always name the same run."""
    return f"{target}-{cutoff:%Y%m%dT%H%M%SZ}" + ("-dry" if dry_run else "")


@dataclasses.dataclass(frozen=True)
class Started:
    """What a trigger did: created, attached, resumed (a stalled sweep), restarted or refused.

    ``refused`` is a run that ended ``failed`` before its sweep was sent: the store
    did not prove that it honours delete conditions (the run's ``reason`` and
    ``message`` say what it found and what to set).
    """

    run_id: str
    action: Literal["created", "attached", "resumed", "restarted", "refused"]
    status: str


def start(
    runtime: Runtime,
    target: Target,
    cutoff: datetime,
    *,
    dry_run: bool = False,
    force: bool = False,
    trigger: str = "cli",
) -> Started:
    """Open the run for (target, cutoff) and send its sweep, unless it already exists.

    A second trigger for a run in progress attaches to it (beat firing twice, an
    operator re-running).  A run whose sweep stopped making progress for longer
    than the visibility timeout gets its sweep sent again: it resumes from
    the checkpoint.  A ``failed`` run starts over, since nothing it refused was deleted,
    and so does a finished run whose target's scope has changed since.

    Before a sweep is sent for a scope the target has not proved (see
    :func:`_unproven`), the store is probed; a run it does not pass is ``refused``.

    Raises :class:`CutoffError` for a cutoff inside the target's retention window,
    whoever asks for it (the CLI, beat, or a trigger sent through Flower's API).
    """
    store = runtime.store
    kind = target.make_kind(runtime.settings)
    _check_cutoff(runtime, target, kind, cutoff)
    run_id = run_id_for(target.name, cutoff, dry_run=dry_run)
    fields = _run_fields(target, kind, cutoff, dry_run=dry_run, force=force, trigger=trigger)
    status = store.runs.open(run_id, fields)
    if status in FINAL_STATUSES and status != "failed":
        previous = store.runs.get(run_id).fields.get("scope", "")
        if previous and previous != kind.scope_digest:
            status = "failed"  # listed under another scope: list again under this one
    if status == "failed":
        store.reset(run_id)
        status = store.runs.open(run_id, fields)
        action: Literal["created", "attached", "resumed", "restarted"] = "restarted"
    else:
        action = "created" if status == "created" else "attached"
    if action in ("created", "restarted"):
        log_event(logger, "run", runtime.settings, run_id=run_id, status="running",
                  trigger=trigger, action=action, cutoff=cutoff.isoformat(),
                  dry_run=dry_run)  # fmt: skip
        refused = _sweep_if_proven(runtime, target, kind, run_id, dry_run=dry_run)
        return refused or Started(run_id, action, "running")
    run = store.runs.get(run_id)
    if run.finished and run.fields.get("report_pending") == "1":
        finish_run(runtime, run_id)  # its report could not be written before; try again
    if (
        run.status == "running"
        and run.fields.get("sweep_done") != "1"
        and _stalled(runtime, run.fields)
    ):
        # A start that died while probing left its run open: prove the scope here too.
        refused = _sweep_if_proven(runtime, target, kind, run_id, dry_run=dry_run)
        return refused or Started(run_id, "resumed", run.status)
    return Started(run_id, "attached", run.status)


def _sweep_if_proven(
    runtime: Runtime, target: Target, kind: TargetKind, run_id: str, *, dry_run: bool
) -> Started | None:
    """Send the run's sweep, or refuse the run if its store did not prove its conditions.

    A dry run deletes nothing, so it is not probed (nor does it record a probe).
    """
    refusal = None if dry_run else _unproven(runtime, target, kind)
    if refusal is not None:
        return _refuse(runtime, run_id, refusal)
    runtime.dispatcher.send_sweep(run_id)
    return None


def _unproven(runtime: Runtime, target: Target, kind: TargetKind) -> tuple[str, str] | None:
    """Probe the store unless the target's scope passed before: a refusal, or ``None``.

    The scope digest that passed is recorded per target in Redis, so the probe runs
    once per scope: on the target's first run, and again when its bucket, prefix,
    ``versions`` or ``conditional_deletes`` change.  An emptied Redis probes again.
    Nothing of the target is deleted before this returns ``None``.
    """
    store = runtime.store
    if store.targets.probed_scope(target.name) == kind.scope_digest:
        return None
    try:
        findings = kind.probe_conditions()
    except Exception as exc:  # a probe that cannot run proves nothing
        findings = [Finding("conditional deletes", "problem", f"{type(exc).__name__}: {exc}",
                            UNPROVEN)]  # fmt: skip
    finally:
        kind.close()
    problems = [f for f in findings if f.status == "problem"]
    if not problems:
        store.targets.mark_probed(target.name, kind.scope_digest)
        return None
    details = "; ".join(f"{f.check}: {f.detail}" for f in problems)
    return (
        problems[0].code or UNPROVEN,
        f"refused before listing, nothing deleted: targets.{target.name} deletes a key only "
        f"on the condition its listing saw (S3: its ETag), and the store did not prove it "
        f"honours such conditions ({details}). Run 'digest-cleanup check {target.name}' "
        "after fixing it; the next run probes again",
    )


def _refuse(runtime: Runtime, run_id: str, refusal: tuple[str, str]) -> Started:
    """End a run that was opened but never swept as ``failed``, with its report."""
    reason, message = refusal
    runtime.store.runs.fail(run_id, reason, message)
    log_event(logger, "run", runtime.settings, level=logging.WARNING, run_id=run_id,
              status="failed", action="refused", reason=reason)  # fmt: skip
    finish_run(runtime, run_id)
    return Started(run_id, "refused", "failed")


def _check_cutoff(runtime: Runtime, target: Target, fresh: TargetKind, cutoff: datetime) -> None:
    """Refuse a cutoff inside retention by the earliest trusted clock.

    The earliest of this host's, Redis's and, once this process has heard from it,
    the store's clock (see :mod:`~digest_cleanup.pipeline.trusted_clock`): a fast
    clock here must not let a cutoff inside retention through.
    """
    try:
        kind = runtime.kind(target.name)  # this process's own: it may have seen the store
    except ConfigError:
        kind = fresh
    target.check_cutoff(cutoff, now=trusted_now(runtime.store, kind, target=target.name))


def _run_fields(
    target: Target, kind: TargetKind, cutoff: datetime, *, dry_run: bool, force: bool, trigger: str
) -> dict[str, Any]:
    """What a run records about itself when it opens."""
    return {
        "target": target.name,
        "kind": target.kind,
        "location": kind.describe(),
        "scope": kind.scope_digest,
        "conditional_deletes": kind.conditional,
        "cutoff": cutoff.isoformat(),
        "dry_run": dry_run,
        "forced": force,
        "trigger": trigger,
        "batch_size": target.batch_size,
        "max_delete": target.max_delete,
        # A string: the run store keeps it as written, not as a double rounds it.
        "max_skipped_share": str(target.max_skipped_share),
        "config_digest": target.config_digest,
    }


def _stalled(runtime: Runtime, fields: Any) -> bool:
    """True when the sweep has not checkpointed for longer than a redelivery would take."""
    last = epoch_of(fields.get("sweep_heartbeat") or fields.get("created_at"))
    if last is None:
        return True
    return time.time() - last > runtime.settings.visibility_timeout + STALL_MARGIN_SECONDS


def finish_run(runtime: Runtime, run_id: str) -> dict[str, Any]:
    """Write the report and mark the target's last success; safe to call more than once."""
    store = runtime.store
    run = store.runs.get(run_id)
    summary = run.as_dict()
    target = summary["target"]
    if run.status == "complete" and not summary.get("dry_run"):
        store.targets.mark_success(target)
    summary["failures_by_code"] = store.runs.retry_codes(run_id)
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
    # A redriven or restarted run's state still names its earlier report; the new one
    # goes to a folder of its own and links back, so the reports form a chain.
    previous = summary.pop("report_url", "")
    if previous and not previous.endswith(reports.report_folder(target, run_id, summary)):
        summary["previous_report_url"] = previous
    try:
        url = reports.write_report(runtime.settings, target, run_id, summary, not_deleted)
    except Exception as exc:  # the run's outcome stands; only its report waits
        return _report_pending(runtime, run_id, summary, exc)
    if url:
        summary["report_url"] = url
    summary["report_pending"] = False
    summary.pop("report_error", None)
    # Written last: waiters treat a run as done once its report is out too.
    store.runs.update(run_id, report_url=url or "", finalized_at=now_iso(), report_pending=0)
    store.runs.clear(run_id, "report_error")
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
    runtime.store.runs.update(run_id, report_pending=1, report_error=error, finalized_at=now_iso())
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
    """Every key the run did not delete: kept on purpose first, then dead letters."""

    for kept in runtime.store.runs.skipped_keys(run_id):
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
