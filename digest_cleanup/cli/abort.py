"""``digest-cleanup abort RUN``: end a stuck running run as failed, leaving an audit record.

The abort itself is :func:`digest_cleanup.ops.abort.abort_run`; this asks for
``--yes`` first and prints the run it ended.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import add_command, show_run
from digest_cleanup.errors import UsageError

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``abort``."""
    p = add_command(
        subcommands,
        "abort",
        abort_command,
        "end a stuck running run as failed, leaving an audit record",
    )
    p.add_argument("run_id")
    p.add_argument("--reason", required=True, help="why, for the audit record")
    p.add_argument("--yes", action="store_true", help="required: confirm the abort")


def abort_command(args: argparse.Namespace, ctx: Context) -> int:
    """Fail a running run on purpose; its next trigger lists the target afresh."""
    from digest_cleanup.ops.abort import abort_run

    if not args.yes:
        raise UsageError("abort ends the run as failed; look at 'status RUN' first, then add --yes")
    ctx.ping()
    command = "digest-cleanup " + shlex.join(sys.argv[1:])
    result = abort_run(ctx.runtime, args.run_id, args.reason, command)
    return show_run(result.as_dict(), args.json)
