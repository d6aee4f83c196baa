"""``digest-cleanup targets``: the configured targets, with where each one deletes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from digest_cleanup.cli.context import EXIT_OK, add_command, print_json, table
from digest_cleanup.clock import utcnow
from digest_cleanup.errors import ConfigError

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``targets``."""
    add_command(subcommands, "targets", targets_command, "list the configured targets")


def targets_command(args: argparse.Namespace, ctx: Context) -> int:
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
