"""``digest-cleanup run TARGET``: start (or attach to) the run of a target for a cutoff.

Starting is :func:`digest_cleanup.pipeline.lifecycle.start`; ``--wait`` follows
the run with :func:`digest_cleanup.ops.progress.wait`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import add_command, parse_cutoff, show_run
from digest_cleanup.clock import utcnow

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``run``."""
    p = add_command(
        subcommands, "run", run_command, "start (or attach to) the run of a target for a cutoff"
    )
    p.add_argument("target")
    p.add_argument("--cutoff", help="ISO 8601; default now minus retention_days (UTC if no zone)")
    p.add_argument("--dry-run", action="store_true", help="count and sample, delete nothing")
    p.add_argument("--force", action="store_true", help="skip the max_delete guard for this run")
    p.add_argument("--wait", action="store_true", help="wait for the end, showing progress")
    p.add_argument(
        "--timeout", type=float, help="with --wait: give up waiting after this many seconds"
    )


def run_command(args: argparse.Namespace, ctx: Context) -> int:
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
    run = ctx.runtime.store.runs.get(started.run_id)
    if args.wait:
        run = progress.wait(
            ctx.runtime.store, started.run_id, show=not args.json, timeout=args.timeout
        )
    return show_run(run.as_dict() | {"action": started.action}, args.json)
