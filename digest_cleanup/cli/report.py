"""``digest-cleanup report RUN``: write a finished run's audit report again."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import EXIT_FAILED, EXIT_OK, add_command, print_json
from digest_cleanup.errors import UsageError

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``report``."""
    p = add_command(
        subcommands,
        "report",
        report_command,
        "write a finished run's audit report again (one left pending)",
    )
    p.add_argument("run_id")


def report_command(args: argparse.Namespace, ctx: Context) -> int:
    """Write the report of a finished run; counts nothing, so it is safe to repeat."""
    from digest_cleanup.pipeline.lifecycle import finish_run

    ctx.ping()
    run = ctx.runtime.store.runs.get(args.run_id)
    if not run.finished:
        raise UsageError(f"run {args.run_id} is {run.status}: its report is written when it ends")
    finish_run(ctx.runtime, args.run_id)
    data = ctx.runtime.store.runs.get(args.run_id).as_dict()
    if args.json:
        print_json(data)
    elif data.get("report_pending"):
        print(f"report still pending: {data['report_error']}", file=sys.stderr)
    else:
        print(data.get("report_url") or "no audit location (CLEANUP_AUDIT_URL) is set")
    return EXIT_FAILED if data.get("report_pending") else EXIT_OK
