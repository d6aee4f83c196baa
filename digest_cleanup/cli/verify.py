"""``digest-cleanup verify TARGET``: count expired keys still present; exit 1 if any."""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING, Any

import redis

from digest_cleanup.cli.context import (
    EXIT_FAILURES,
    EXIT_OK,
    add_command,
    parse_cutoff,
    print_json,
)
from digest_cleanup.clock import utcnow

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``verify``."""
    p = add_command(
        subcommands, "verify", verify_command, "count expired keys still present; exit 1 if any"
    )
    p.add_argument("target")
    p.add_argument("--cutoff", help="ISO 8601; default now minus retention_days")


def verify_command(args: argparse.Namespace, ctx: Context) -> int:
    target = ctx.runtime.target(args.target)
    cutoff = parse_cutoff(args.cutoff) if args.cutoff else target.cutoff_for(utcnow())
    kind = ctx.runtime.kind(target.name)
    remaining = kind.remaining(cutoff)
    data: dict[str, Any] = {
        "target": target.name,
        "location": kind.describe(),
        "cutoff": cutoff.isoformat(),
        "remaining_expired": remaining,
        **kind.verify_extra(cutoff),
        "checked_at": utcnow().isoformat(),
    }
    # Metrics read the last verify; a verify without Redis still answers.
    with contextlib.suppress(redis.RedisError):
        ctx.runtime.store.targets.save_verify(target.name, data)
    if args.json:
        print_json(data)
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
