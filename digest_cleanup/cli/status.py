"""``digest-cleanup status RUN`` and ``digest-cleanup runs``: one run, and the recent ones."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import EXIT_OK, add_command, print_json, show_run, table

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``status`` and ``runs``."""
    p = add_command(subcommands, "status", status_command, "show one run")
    p.add_argument("run_id")
    p.add_argument("--watch", action="store_true", help="follow the run live until it ends")

    p = add_command(subcommands, "runs", runs_command, "list recent runs, newest first")
    p.add_argument("--target")
    p.add_argument("--limit", type=int, default=20)


def status_command(args: argparse.Namespace, ctx: Context) -> int:
    from digest_cleanup.ops import progress

    ctx.ping()
    run = ctx.runtime.store.runs.get(args.run_id)
    if args.watch:
        run = progress.wait(ctx.runtime.store, args.run_id, show=not args.json)
    data = run.as_dict()
    data["failures_by_code"] = ctx.runtime.store.runs.retry_codes(args.run_id)
    budget = ctx.runtime.budget_state(run.fields.get("target", ""))
    if budget is not None:
        data["delete_budget"] = budget.as_dict()
    return show_run(data, args.json)


def runs_command(args: argparse.Namespace, ctx: Context) -> int:
    ctx.ping()
    store = ctx.runtime.store
    rows = []
    for run_id in store.runs.run_ids(limit=max(args.limit * 5, 50)):
        run = store.runs.find(run_id)
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
