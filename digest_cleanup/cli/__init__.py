"""The ``digest-cleanup`` command.

Exit codes: 0 complete (or nothing wrong); 1 ``complete_with_failures``, or
``verify`` found expired keys left; 2 a usage, configuration or connection
error, with one line on stderr; 3 the run ``failed`` (for example
``max_delete_exceeded``).  Every command takes ``--json``.

Each module ``cli/<command>.py`` adds ``digest-cleanup <command>`` with one
``register(subcommands)``: ``cli/dlq.py`` adds ``dlq`` and its actions, and
``cli/status.py`` adds ``status`` and ``runs``, the list of runs.  Every command
is bound to its handler, ``<command>_command(args, ctx)`` (``dlq_list_command``
for ``dlq list``), by :func:`~digest_cleanup.cli.context.add_command`, which
also gives it ``--json``.  The modules share :mod:`digest_cleanup.cli.context`
and never import each other; what a command does beyond reading and printing
is in :mod:`digest_cleanup.ops` or :mod:`digest_cleanup.pipeline`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import redis

from digest_cleanup.cli import (
    abort,
    check,
    console,
    dlq,
    metrics,
    plan,
    report,
    run,
    status,
    targets,
    verify,
)
from digest_cleanup.cli.context import EXIT_USAGE, Context
from digest_cleanup.errors import CleanupError
from digest_cleanup.settings import Settings


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
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # In the order ``--help`` lists them: the run's life first, then the tools.
    for module in (targets, run, status, abort, report, verify, check, metrics, plan, dlq, console):
        module.register(subcommands)
    return parser
