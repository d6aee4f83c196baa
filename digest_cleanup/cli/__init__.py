"""The ``digest-cleanup`` command.

Exit codes: 0 complete (or nothing wrong); 1 ``complete_with_failures``, or
``verify`` found expired items left; 2 a usage, configuration or connection
error, with one line on stderr; 3 the run ``failed`` (for example
``max_delete_exceeded``).  Every command takes ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import redis

from digest_cleanup.config.settings import Settings
from digest_cleanup.errors import CleanupError, ConfigError, UsageError
from digest_cleanup.worker.broker import eviction_problem, safe_url

EXIT_OK, EXIT_FAILURES, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
STATUS_EXIT = {"complete": EXIT_OK, "complete_with_failures": EXIT_FAILURES, "failed": EXIT_FAILED}

Command = Callable[[argparse.Namespace, "Context"], int]


class Context:
    """What a command needs, built lazily so ``--help`` needs no Redis."""

    def __init__(self, settings: Settings) -> None:
        from digest_cleanup.pipeline.runtime import Runtime

        self.settings = settings
        self.runtime = Runtime(settings)
        self._app: Any = None

    @property
    def app(self) -> Any:
        if self._app is None:
            from digest_cleanup.worker.app import create_app

            self._app = create_app(self.settings, self.runtime.targets)
            self._app.digest_cleanup_runtime = self.runtime
        return self._app

    def ping(self) -> None:
        """Fail unless Redis answers and cannot evict the run state."""
        try:
            self.runtime.redis.ping()
            problem = eviction_problem(self.runtime.redis, self.settings.broker_url)
        except redis.RedisError as exc:
            raise CleanupError(
                f"cannot reach Redis at CLEANUP_BROKER_URL={safe_url(self.settings.broker_url)}: "
                f"{exc}; start Redis or fix CLEANUP_BROKER_URL"
            ) from None
        if problem:
            raise ConfigError(problem)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        ctx = Context(Settings.from_env())
        return int(args.handler(args, ctx))
    except CleanupError as exc:
        print(f"digest-cleanup: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.RedisError as exc:
        print(f"digest-cleanup: error: Redis: {exc}; check CLEANUP_BROKER_URL", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("digest-cleanup: interrupted; the run goes on in the workers", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="digest-cleanup",
        description="Delete expired weekly-digest artifacts with Celery workers, "
        "and account for every one.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, handler: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print JSON only")
        p.set_defaults(handler=handler)
        return p

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

    p = add("verify", cmd_verify, "count expired items still present; exit 1 if any")
    p.add_argument("target")
    p.add_argument("--cutoff", help="ISO 8601; default now minus retention_days")

    from digest_cleanup.cli import check as cli_check

    p = add("check", cli_check.run, "probe a target's store and Redis before a first run")
    cli_check.register(p)

    from digest_cleanup.cli import metrics as cli_metrics

    p = add("metrics", cli_metrics.cmd_metrics, "serve Prometheus metrics read from the run store")
    cli_metrics.add_arguments(p)

    from digest_cleanup.cli import plan as cli_plan

    p = add("plan", cli_plan.run, "workers and concurrency for N artifacts in a time window")
    cli_plan.register(p)

    dlq = sub.add_parser("dlq", help="list, show, redrive and purge dead letters")
    dsub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    def add_dlq(
        name: str, handler: Command, help_text: str, selectors: bool
    ) -> argparse.ArgumentParser:
        p = dsub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print JSON only")
        p.set_defaults(handler=handler, command=f"dlq {name}")
        if selectors:
            p.add_argument("ids", nargs="*", metavar="ID", help="entry ids")
            p.add_argument("--all", action="store_true", help="every entry")
        p.add_argument("--run", help="entries of this run")
        p.add_argument("--target", help="entries of this target")
        p.add_argument("--error", help="entries with this error code or reason")
        return p

    from digest_cleanup.cli import dlq as cli_dlq

    add_dlq("list", cli_dlq.cmd_list, "peek at dead letters (nothing is consumed)", False)
    p = dsub.add_parser("show", help="show one entry in full")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cli_dlq.cmd_show, command="dlq show")
    p = add_dlq("redrive", cli_dlq.cmd_redrive, "move entries back onto the work queue", True)
    p.add_argument("--dry-run", action="store_true", help="say what would move, move nothing")
    p = add_dlq("purge", cli_dlq.cmd_purge, "drop entries for good, leaving an audit record", True)
    p.add_argument("--yes", action="store_true", help="required: confirm the purge")

    return parser


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
            "last_slot": t.last_slot(_now()).isoformat(),
        }
        try:
            row["location"] = t.make_kind(ctx.settings).describe()
        except ConfigError as exc:
            # A secret such as a DSN may be set for the workers only: list the
            # target anyway, and say what this shell lacks.
            row["problem"] = str(exc)
        rows.append(row)
    if args.json:
        _print_json({"targets": rows})
    else:
        _table(
            [r | {"location": r["location"] or "?"} for r in rows],
            ["name", "kind", "location", "schedule", "retention_days", "batch_size", "max_delete"],
        )
        for row in rows:
            if "problem" in row:
                print(f"{row['name']}: location unknown here: {row['problem']}")
    return EXIT_OK


def cmd_run(args: argparse.Namespace, ctx: Context) -> int:
    from digest_cleanup.pipeline import progress
    from digest_cleanup.pipeline.sweep import start
    from digest_cleanup.worker.tasks.base import enqueue_sweep

    target = ctx.runtime.target(args.target)
    cutoff = parse_cutoff(args.cutoff) if args.cutoff else target.cutoff_for(_now())
    target.check_cutoff(cutoff)  # before anything connects: the answer needs no service
    ctx.ping()
    started = start(
        ctx.runtime,
        target,
        cutoff,
        lambda run_id: enqueue_sweep(ctx.app, run_id),
        dry_run=args.dry_run,
        force=args.force,
        trigger="cli " + shlex.join(sys.argv[1:]) if sys.argv else "cli",
    )
    if not args.json:
        verb = {
            "created": "started",
            "restarted": "restarted",
            "resumed": "resumed the sweep of",
        }.get(started.action, "attached to")
        print(f"{verb} run {started.run_id}", file=sys.stderr)
    run = ctx.runtime.store.get(started.run_id)
    if args.wait:
        run = progress.wait(
            ctx.runtime.store, started.run_id, show=not args.json, timeout=args.timeout
        )
    return _show_run(run.as_dict() | {"action": started.action}, args.json)


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    from digest_cleanup.pipeline import progress

    ctx.ping()
    run = ctx.runtime.store.get(args.run_id)
    if args.watch:
        run = progress.wait(ctx.runtime.store, args.run_id, show=not args.json)
    data = run.as_dict()
    data["retries_by_code"] = ctx.runtime.store.retry_codes(args.run_id)
    return _show_run(data, args.json)


def cmd_abort(args: argparse.Namespace, ctx: Context) -> int:
    """Fail a running run on purpose; its next trigger lists the target afresh."""
    from digest_cleanup.pipeline import audit
    from digest_cleanup.pipeline.dead_letter import who
    from digest_cleanup.pipeline.lifecycle import finish_run
    from digest_cleanup.pipeline.runs import now_iso
    from digest_cleanup.worker.app import dead_letter_queue

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
    dead_letter_queue(ctx.runtime).log_action(record)
    kept = audit.write_abort(ctx.settings, at, record)
    finish_run(ctx.runtime, args.run_id)
    data = store.get(args.run_id).as_dict() | {"audit_record": record, "audit_url": kept}
    return _show_run(data, args.json)


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
        _print_json(data)
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
        _print_json({"runs": rows})
    else:
        _table(rows, ["run_id", "status", "expired", "deleted", "dead_lettered", "created_at"])
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, ctx: Context) -> int:
    target = ctx.runtime.target(args.target)
    cutoff = parse_cutoff(args.cutoff) if args.cutoff else target.cutoff_for(_now())
    kind = ctx.runtime.kind(target.name)
    remaining = kind.remaining(cutoff)
    data: dict[str, Any] = {
        "target": target.name,
        "location": kind.describe(),
        "cutoff": cutoff.isoformat(),
        "remaining_expired": remaining,
        **kind.verify_extra(cutoff),
        "checked_at": _now().isoformat(),
    }
    # Metrics read the last verify; a verify without Redis still answers.
    with contextlib.suppress(redis.RedisError):
        ctx.runtime.store.save_verify(target.name, data)
    if args.json:
        _print_json(data)
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


def parse_cutoff(text: str) -> datetime:
    """ISO 8601; a naive time is taken as UTC."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--cutoff: {text!r} is not ISO 8601; use e.g. 2026-11-22T03:00:00Z"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(microsecond=0)


def _show_run(data: dict[str, Any], as_json: bool) -> int:
    if as_json:
        _print_json(data)
    else:
        print(f"run {data['run_id']}: {data.get('status')}")
        for key in (
            "target",
            "location",
            "cutoff",
            "listed",
            "expired",
            "batches",
            "deleted",
            "dead_lettered",
            "skipped",
            "retries",
            "redriven",
            "duplicates",
            "created_at",
            "ended_at",
            "reason",
            "message",
            "report_url",
        ):
            if key in data and data[key] not in ("", None):
                print(f"  {key:14} {data[key]}")
        if data.get("sample"):
            print("  sample of items that would be deleted:")
            for item in data["sample"]:
                print(f"    {item}")
    return STATUS_EXIT.get(str(data.get("status")), EXIT_OK)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


if __name__ == "__main__":
    sys.exit(main())
