"""The run commands: targets, run, status, abort, report, runs, verify."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from typing import Any

import redis

from digest_cleanup.cli.context import (
    EXIT_FAILED,
    EXIT_FAILURES,
    EXIT_OK,
    AddCommand,
    Context,
    parse_cutoff,
    print_json,
    show_run,
    table,
)
from digest_cleanup.clock import utcnow
from digest_cleanup.errors import ConfigError, UsageError


def register(add: AddCommand) -> None:
    """Add the run commands to the parser."""
    add("targets", cmd_targets, "list the configured targets")

    p = add("run", cmd_run, "start (or attach to) the run of a target for a cutoff")
    p.add_argument("target")
    p.add_argument("--cutoff", help="ISO 8601; default now minus retention_days (UTC if no zone)")
    p.add_argument("--dry-run", action="store_true", help="count and sample, delete nothing")
    p.add_argument("--force", action="store_true", help="skip the max_delete guard for this run")
    p.add_argument("--wait", action="store_true", help="wait for the end, showing progress")
    p.add_argument(
        "--timeout", type=float, help="with --wait: give up waiting after this many seconds"
    )

    p = add("status", cmd_status, "show one run")
    p.add_argument("run_id")
    p.add_argument("--watch", action="store_true", help="follow the run live until it ends")

    p = add("abort", cmd_abort, "end a stuck running run as failed, leaving an audit record")
    p.add_argument("run_id")
    p.add_argument("--reason", required=True, help="why, for the audit record")
    p.add_argument("--yes", action="store_true", help="required: confirm the abort")

    p = add("report", cmd_report, "write a finished run's audit report again (one left pending)")
    p.add_argument("run_id")

    p = add("runs", cmd_runs, "list recent runs, newest first")
    p.add_argument("--target")
    p.add_argument("--limit", type=int, default=20)

    p = add("verify", cmd_verify, "count expired keys still present; exit 1 if any")
    p.add_argument("target")
    p.add_argument("--cutoff", help="ISO 8601; default now minus retention_days")


def cmd_targets(args: argparse.Namespace, ctx: Context) -> int:
    rows = []
    for t in ctx.runtime.targets:
        row: dict[str, Any] = {
            "name": t.name,
            "kind": t.kind,
            "location": None,
            "schedule": t.schedule,
            "retention_days": t.retention_days,
            "batch_size": t.batch_size,
            "max_delete": t.max_delete,
            # Keys/s every worker shares; 0 when the target has no budget.
            "delete_rate": t.delete_budget(ctx.settings),
            "last_slot": t.last_slot(utcnow()).isoformat(),
        }
        try:
            row["location"] = t.make_kind(ctx.settings).describe()
        except ConfigError as exc:
            # A secret such as a DSN may be set for the workers only: list the
            # target anyway, and say what this shell lacks.
            row["problem"] = str(exc)
        rows.append(row)
    if args.json:
        print_json({"targets": rows})
    else:
        table(
            [
                r | {"location": r["location"] or "?", "delete_rate": _rate(r["delete_rate"])}
                for r in rows
            ],
            [
                "name",
                "kind",
                "location",
                "schedule",
                "retention_days",
                "batch_size",
                "max_delete",
                "delete_rate",
            ],
        )
        for row in rows:
            if "problem" in row:
                print(f"{row['name']}: location unknown here: {row['problem']}")
    return EXIT_OK


def _rate(rate: float) -> str:
    return f"{rate:,.0f}/s" if rate else "none"


def cmd_run(args: argparse.Namespace, ctx: Context) -> int:
    from digest_cleanup.ops import progress
    from digest_cleanup.pipeline.lifecycle import start

    target = ctx.runtime.target(args.target)
    cutoff = parse_cutoff(args.cutoff) if args.cutoff else target.cutoff_for(utcnow())
    target.check_cutoff(cutoff)  # before anything connects: the answer needs no service
    ctx.ping()
    started = start(
        ctx.sending_runtime(),
        target,
        cutoff,
        dry_run=args.dry_run,
        force=args.force,
        trigger="cli " + shlex.join(sys.argv[1:]) if sys.argv else "cli",
    )
    if not args.json:
        verb = {
            "created": "started",
            "restarted": "restarted",
            "resumed": "resumed the sweep of",
            "refused": "refused",
        }.get(started.action, "attached to")
        print(f"{verb} run {started.run_id}", file=sys.stderr)
    run = ctx.runtime.store.get(started.run_id)
    if args.wait:
        run = progress.wait(
            ctx.runtime.store, started.run_id, show=not args.json, timeout=args.timeout
        )
    return show_run(run.as_dict() | {"action": started.action}, args.json)


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    from digest_cleanup.ops import progress

    ctx.ping()
    run = ctx.runtime.store.get(args.run_id)
    if args.watch:
        run = progress.wait(ctx.runtime.store, args.run_id, show=not args.json)
    data = run.as_dict()
    data["failures_by_code"] = ctx.runtime.store.retry_codes(args.run_id)
    budget = ctx.runtime.budget_state(run.fields.get("target", ""))
    if budget is not None:
        data["delete_budget"] = budget.as_dict()
    return show_run(data, args.json)


def cmd_abort(args: argparse.Namespace, ctx: Context) -> int:
    """Fail a running run on purpose; its next trigger lists the target afresh."""
    from digest_cleanup.audit import reports
    from digest_cleanup.clock import now_iso
    from digest_cleanup.model.dead_letters import who
    from digest_cleanup.pipeline.lifecycle import finish_run

    if not args.yes:
        raise UsageError("abort ends the run as failed; look at 'status RUN' first, then add --yes")
    ctx.ping()
    store = ctx.runtime.store
    before = store.get(args.run_id).as_dict()
    message = f"aborted by {who()}: {args.reason}"
    result = store.abort(args.run_id, message)
    if result != "aborted":
        raise UsageError(f"run {args.run_id} is {result}, not running: nothing to abort")
    at = now_iso()
    record = {"action": "abort", "at": at, "by": who(), "command": "digest-cleanup " +
              shlex.join(sys.argv[1:]), "reason": args.reason, "run": before}  # fmt: skip
    ctx.runtime.dead_letters.log_action(record)
    kept = reports.write_abort(ctx.settings, at, record)
    finish_run(ctx.runtime, args.run_id)
    data = store.get(args.run_id).as_dict() | {"audit_record": record, "audit_url": kept}
    return show_run(data, args.json)


def cmd_report(args: argparse.Namespace, ctx: Context) -> int:
    """Write the report of a finished run; counts nothing, so it is safe to repeat."""
    from digest_cleanup.pipeline.lifecycle import finish_run

    ctx.ping()
    run = ctx.runtime.store.get(args.run_id)
    if not run.finished:
        raise UsageError(f"run {args.run_id} is {run.status}: its report is written when it ends")
    finish_run(ctx.runtime, args.run_id)
    data = ctx.runtime.store.get(args.run_id).as_dict()
    if args.json:
        print_json(data)
    elif data.get("report_pending"):
        print(f"report still pending: {data['report_error']}", file=sys.stderr)
    else:
        print(data.get("report_url") or "no audit location (CLEANUP_AUDIT_URL) is set")
    return EXIT_FAILED if data.get("report_pending") else EXIT_OK


def cmd_runs(args: argparse.Namespace, ctx: Context) -> int:
    ctx.ping()
    store = ctx.runtime.store
    rows = []
    for run_id in store.run_ids(limit=max(args.limit * 5, 50)):
        run = store.find(run_id)
        if run is None or (args.target and run.fields.get("target") != args.target):
            continue
        rows.append(run.as_dict())
        if len(rows) >= args.limit:
            break
    if args.json:
        print_json({"runs": rows})
    else:
        table(rows, ["run_id", "status", "expired", "deleted", "dead_lettered", "created_at"])
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, ctx: Context) -> int:
    target = ctx.runtime.target(args.target)
    cutoff = parse_cutoff(args.cutoff) if args.cutoff else target.cutoff_for(utcnow())
    kind = ctx.runtime.kind(target.name)
    remaining = kind.remaining(cutoff)
    data: dict[str, Any] = {
        "target": target.name,
        "location": kind.describe(),
        "cutoff": cutoff.isoformat(),
        "remaining_expired": remaining,
        **kind.verify_extra(cutoff),
        "checked_at": utcnow().isoformat(),
    }
    # Metrics read the last verify; a verify without Redis still answers.
    with contextlib.suppress(redis.RedisError):
        ctx.runtime.store.save_verify(target.name, data)
    if args.json:
        print_json(data)
    else:
        state = "OK" if remaining == 0 else "EXPIRED ITEMS REMAIN"
        print(
            f"{target.name} {kind.describe()} cutoff {cutoff.isoformat()}: "
            f"{remaining} expired left - {state}"
        )
        for key, value in data.items():
            if key not in ("target", "location", "cutoff", "remaining_expired", "checked_at"):
                print(f"  {key}: {value}")
    return EXIT_OK if remaining == 0 else EXIT_FAILURES
