"""``digest-cleanup dlq``: answer "which ones did not get deleted, and why?", then act on it."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import Handler, add_command, print_json
from digest_cleanup.errors import UsageError
from digest_cleanup.model.dead_letters import ENTRY_FIELDS, Entry

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands

#: Keys shown per entry in the human listing; ``dlq show`` and ``--json`` give all.
KEYS_SHOWN = 5


def register(subcommands: Subcommands) -> None:
    """Add ``dlq`` and its actions: ``list``, ``show``, ``redrive``, ``purge``."""
    dlq = subcommands.add_parser("dlq", help="list, show, redrive and purge dead letters")
    actions = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    def add_action(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = add_command(actions, name, handler, help_text)
        p.set_defaults(command=f"dlq {name}")
        return p

    def add_filters(p: argparse.ArgumentParser, *, selectors: bool) -> None:
        if selectors:
            p.add_argument("ids", nargs="*", metavar="ID", help="entry ids")
            p.add_argument("--all", action="store_true", help="every entry")
        p.add_argument("--run", help="entries of this run")
        p.add_argument("--target", help="entries of this target")
        p.add_argument("--error", help="entries with this error code or reason")

    p = add_action("list", dlq_list_command, "peek at dead letters (nothing is consumed)")
    add_filters(p, selectors=False)
    p = add_action("show", dlq_show_command, "show one entry in full")
    p.add_argument("id")
    p = add_action("redrive", dlq_redrive_command, "move entries back onto the work queue")
    add_filters(p, selectors=True)
    p.add_argument("--dry-run", action="store_true", help="say what would move, move nothing")
    p = add_action("purge", dlq_purge_command, "drop entries for good, leaving an audit record")
    add_filters(p, selectors=True)
    p.add_argument("--yes", action="store_true", help="required: confirm the purge")


def _select(args: argparse.Namespace, ctx: Context) -> list[Entry]:
    ctx.ping()
    return ctx.runtime.dead_letters.select(
        ids=args.ids or (),
        run=args.run,
        target=args.target,
        error=args.error,
        everything=args.all,
    )


def dlq_list_command(args: argparse.Namespace, ctx: Context) -> int:
    ctx.ping()
    dlq = ctx.runtime.dead_letters
    entries = dlq.select(run=args.run, target=args.target, error=args.error, everything=True)
    data = [e.as_dict() for e in entries]
    if args.json:
        print_json({"depth": dlq.depth(), "entries": data})
        return 0
    if not data:
        print("dead-letter queue is empty" if dlq.depth() == 0 else "no entry matches")
        return 0
    for e in data:
        keys = f"{e['key_count']} key" + ("" if e["key_count"] == 1 else "s")
        print(
            f"{e['id']}  run {e['run_id']}  {keys}  reason {e['reason']}  "
            f"attempts {e['attempts']}  first {e['first_failure_at']}  last {e['last_failure_at']}"
        )
        for key in e["keys"][:KEYS_SHOWN]:
            print(f"    {key['code']:<16} {key['key']}  {key['message']}")
        if len(e["keys"]) > KEYS_SHOWN:
            print(f"    ... {len(e['keys']) - KEYS_SHOWN} more (dlq show {e['id']})")
    return 0


def dlq_show_command(args: argparse.Namespace, ctx: Context) -> int:
    ctx.ping()
    entry = ctx.runtime.dead_letters.get(args.id).as_dict()
    if args.json:
        print_json(entry)
        return 0
    for key in ENTRY_FIELDS:
        print(f"{key:17} {entry[key]}")
    for key in entry["keys"]:
        print(f"  {key['code']:<16} {key['key']}  {key['message']}")
    return 0


def dlq_redrive_command(args: argparse.Namespace, ctx: Context) -> int:
    """Move the selected entries back; exit 1 when any was refused (it stays, with why)."""
    from digest_cleanup.ops.redrive import redrive_entries

    result = redrive_entries(ctx.runtime, _select(args, ctx), dry_run=args.dry_run)
    if args.json:
        print_json(result.as_dict())
    else:
        verb = "would redrive" if args.dry_run else "redrove"
        print(f"{verb} {len(result.movable)} entries ({result.keys} keys)")
        for entry_id in result.movable:
            print(f"  {entry_id}")
        if result.refused:
            print(f"refused {len(result.refused)} entries; they stay in the queue:")
            for r in result.refused:
                print(f"  {r.entry_id}  {r.reason}: {r.message}")
    return 1 if result.refused else 0


def dlq_purge_command(args: argparse.Namespace, ctx: Context) -> int:
    if not args.yes:
        raise UsageError("dlq purge drops entries for good; add --yes to confirm")
    from digest_cleanup.ops.purge import purge_entries

    command = "digest-cleanup " + shlex.join(sys.argv[1:])
    result = purge_entries(ctx.runtime, _select(args, ctx), command)
    if args.json:
        print_json(result.as_dict())
    else:
        kept = result.audit_url
        where = ctx.runtime.dead_letters.audit_key + (f" and {kept}" if kept else "")
        print(f"purged {len(result.records)} entries; audit records written to {where}")
    return 0
