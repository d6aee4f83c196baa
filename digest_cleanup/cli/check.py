"""``digest-cleanup check TARGET``: what a first run relies on, proved before it runs.

It asks the target's kind to probe its store (for S3: credentials, the bucket,
versioning, listing, and whether the endpoint really honours conditional
deletes, on both delete paths and for a multipart ETag), and checks that Redis
cannot evict the run state.  Exit 0 when nothing is a problem, 1 otherwise.

A run does not need it to be safe: a target's first run, and its first after its
scope changes, runs the same conditional-delete probe itself and refuses to start
on a problem (see :func:`digest_cleanup.pipeline.lifecycle.start`).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import redis

from digest_cleanup import broker
from digest_cleanup.cli.context import add_command
from digest_cleanup.kinds import Finding

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``check``."""
    p = add_command(
        subcommands, "check", check_command, "probe a target's store and Redis before a first run"
    )
    p.add_argument("target")


def check_command(args: argparse.Namespace, ctx: Context) -> int:
    target = ctx.runtime.target(args.target)
    kind = target.make_kind(ctx.settings)
    try:
        findings = [*kind.check(), redis_eviction(ctx.runtime.redis, ctx.settings.broker_url)]
    finally:
        kind.close()
    problems = sum(f.status == "problem" for f in findings)
    if args.json:
        rows = [
            {"check": f.check, "status": f.status, "detail": f.detail, "code": f.code}
            for f in findings
        ]
        print(json.dumps({"target": target.name, "findings": rows, "problems": problems}))
    else:
        print(f"{target.name} ({kind.describe()}):")
        width = max(len(f.check) for f in findings)
        for f in findings:
            print(f"  {f.check:<{width}}  {f.status:<7}  {f.detail}")
        print("no problems found" if not problems else f"{problems} problem(s) found")
    return 0 if not problems else 1


def redis_eviction(client: redis.Redis, url: str) -> Finding:
    """Whether Redis may evict keys (queued batches, run state) under memory pressure."""
    name = "redis eviction policy"
    try:
        policy = broker.eviction_policy(client)
        problem = broker.eviction_problem(client, url)
    except redis.RedisError as exc:
        return Finding(name, "problem", f"cannot reach Redis at {broker.safe_url(url)}: {exc}")
    if policy is None:
        return Finding(
            name,
            "warning",
            "could not read maxmemory-policy (CONFIG is not allowed); make sure it is "
            f"{broker.SAFE_EVICTION_POLICY}",
        )
    if problem:
        return Finding(name, "problem", problem)
    return Finding(name, "ok", f"maxmemory-policy is {policy}")
