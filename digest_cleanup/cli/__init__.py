"""The ``digest-cleanup`` command.

Exit codes: 0 complete (or nothing wrong); 1 ``complete_with_failures``, or
``verify`` found expired keys left; 2 a usage, configuration or connection
error, with one line on stderr; 3 the run ``failed`` (for example
``max_delete_exceeded``).  Every command takes ``--json``.

One module per command group registers its commands here; they share
:mod:`digest_cleanup.cli.context` and never import each other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import redis

from digest_cleanup.cli import check, console, dlq, metrics, plan, runs
from digest_cleanup.cli.context import EXIT_USAGE, Command, Context
from digest_cleanup.config.settings import Settings
from digest_cleanup.errors import CleanupError


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

    runs.register(add)
    check.register(add("check", check.run, "probe a target's store and Redis before a first run"))
    metrics.add_arguments(
        add("metrics", metrics.cmd_metrics, "serve Prometheus metrics read from the run store")
    )
    plan.register(add("plan", plan.run, "workers and concurrency for N artifacts in a time window"))
    dlq.register(sub)
    console.add_arguments(
        add("console", console.cmd_console, "serve the operations console: runs and dead letters")
    )
    return parser
