"""What every command works with: the context, exit codes, registration and output helpers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis

from digest_cleanup.broker import eviction_problem, safe_url
from digest_cleanup.errors import CleanupError, ConfigError, UsageError
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings

EXIT_OK, EXIT_FAILURES, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
STATUS_EXIT = {"complete": EXIT_OK, "complete_with_failures": EXIT_FAILURES, "failed": EXIT_FAILED}

#: What a command runs: ``<command>_command(args, ctx)``, returning the exit code.
Handler = Callable[[argparse.Namespace, "Context"], int]

if TYPE_CHECKING:
    #: What ``register(subcommands)`` adds its commands to.
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def add_command(
    subcommands: Subcommands, name: str, handler: Handler, help_text: str
) -> argparse.ArgumentParser:
    """Add the command ``name``, with ``--json`` on it, bound to ``handler``."""
    parser = subcommands.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(handler=handler)
    return parser


class Context:
    """What a command needs, built lazily so ``--help`` needs no Redis."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runtime = Runtime(settings)
        self._app: Any = None

    def sending_runtime(self) -> Runtime:
        """The runtime, with the Celery app built so that it can send (``run`` does)."""
        if self._app is None:
            from digest_cleanup.app import create_app

            self._app = create_app(runtime=self.runtime)
        return self.runtime

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


def show_run(data: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print_json(data)
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
        if budget := data.get("delete_budget"):
            paused = f", paused {budget['paused_for']:.1f} s" if budget["paused_for"] else ""
            print(
                f"  {'delete rate':14} {budget['rate']:,.0f} of {budget['ceiling']:,.0f} keys/s"
                f"{paused}; {budget['throttles']} throttled, {budget['waits']} waits "
                f"({budget['wait_seconds']:,.1f} s), {budget['deferred']} handed back"
            )
        if data.get("sample"):
            print("  sample of keys that would be deleted:")
            for key in data["sample"]:
                print(f"    {key}")
    return STATUS_EXIT.get(str(data.get("status")), EXIT_OK)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))
