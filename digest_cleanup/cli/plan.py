"""``digest-cleanup plan``: delete slots and workers for a window, from measured service times.

The arithmetic is :mod:`digest_cleanup.ops.capacity`; this module reads the batch
timings recent runs left in the run store and prints the plan.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import EXIT_OK, add_command, print_json
from digest_cleanup.errors import UsageError
from digest_cleanup.ops.capacity import (
    DEFAULT_PER_WORKER,
    DEFAULT_UTILIZATION,
    Plan,
    ServiceTimes,
    parse_duration,
    plan,
)
from digest_cleanup.targets import DEFAULT_BATCH_SIZE

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands


def register(subcommands: Subcommands) -> None:
    """Add ``plan``."""
    p = add_command(
        subcommands,
        "plan",
        plan_command,
        "workers and concurrency for N artifacts in a time window",
    )
    p.add_argument(
        "--artifacts", type=int, required=True, help="keys one run must delete, e.g. 120000"
    )
    p.add_argument("--window", required=True, help="time the run may take: 90s, 45m, 2h, 1h30m, 1d")
    p.add_argument(
        "--utilization",
        type=float,
        default=DEFAULT_UTILIZATION,
        help="share of the slots' time to plan for (0-1]; default %(default)s",
    )
    p.add_argument(
        "--target", help="plan from this target's timings and batch size; default: all targets"
    )
    p.add_argument(
        "--per-worker",
        type=int,
        default=DEFAULT_PER_WORKER,
        help="delete slots per worker process in the suggested layout; default %(default)s",
    )


def plan_command(args: argparse.Namespace, ctx: Context) -> int:
    """Print the plan for ``--artifacts`` in ``--window``."""
    window = parse_duration(args.window)
    targets = [ctx.runtime.target(args.target)] if args.target else list(ctx.runtime.targets)
    if not targets:
        raise UsageError("no targets configured; add one to the targets file")
    ctx.ping()
    rows = [row for t in targets for row in ctx.runtime.store.runs.timings(t.name)]
    service = ServiceTimes.from_timings(rows)
    sizes = {t.batch_size for t in targets}
    batch_size = sizes.pop() if len(sizes) == 1 else DEFAULT_BATCH_SIZE
    # Targets run side by side, each under its own budget; one without a budget has none.
    budgets = [t.delete_budget(ctx.settings) for t in targets]
    budget = sum(budgets) if all(budgets) else 0.0
    result = plan(
        args.artifacts,
        window,
        service,
        batch_size=batch_size,
        visibility_timeout=ctx.settings.visibility_timeout,
        utilization=args.utilization,
        per_worker=args.per_worker,
        delete_budget=budget,
    )
    if args.json:
        print_json(result.as_dict() | {"targets": [t.name for t in targets]})
    else:
        print(describe(result, [t.name for t in targets]))
    return EXIT_OK


def describe(result: Plan, targets: list[str]) -> str:
    """The plan as a few lines for a terminal."""
    s = result.service
    lines = [
        f"plan: {result.artifacts:,} artifacts in {_duration(result.window_seconds)} "
        f"(targets {', '.join(targets)}; batch size {result.batch_size})",
        f"  measured   {s.attempts:,} recent batch attempts over {s.keys:,} keys: "
        f"{s.per_key * 1000:.2f} ms per key; per batch median {s.median:.2f} s, "
        f"p95 {s.p95:.2f} s, p99 {s.p99:.2f} s (delete call median {s.delete_median:.2f} s, "
        f"overhead median {s.overhead_median * 1000:.1f} ms)",
        f"  needed     {result.batches:,} batches in {result.window_seconds:,.0f} s = "
        f"{result.batches_per_second:.3f} batches/s ({result.deletes_per_second:,.1f} deletes/s)",
        f"  consumers  {result.batches_per_second:.3f} batches/s x {result.batch_seconds:.2f} s "
        f"/ {result.utilization:g} utilization = {result.consumers_exact:.2f} "
        f"-> {result.consumers} delete slot{'s' if result.consumers != 1 else ''}",
        f"  run        {result.workers} worker{'s' if result.workers != 1 else ''} on the "
        f"batches queue with --concurrency {result.concurrency} (threads or prefork; deletes "
        "wait on the store), plus one worker with -Q sweeps --concurrency 1",
        f"  full speed {result.peak_deletes_per_second:,.0f} deletes/s; the guard pass lists "
        "every key before the first delete, so leave the window room for it",
    ]
    if result.budget_seconds is not None:
        lines.append(
            f"  budget     {result.delete_budget:,.0f} keys/s (delete_rate) shared by every "
            f"worker: {result.artifacts:,} keys take at least "
            f"{_duration(result.budget_seconds)} plus one listing; "
            f"{result.saturating_consumers} delete slot"
            f"{'s' if result.saturating_consumers != 1 else ''} "
            f"({result.saturating_workers} worker{'s' if result.saturating_workers != 1 else ''}) "
            "saturate it, and more only wait on it"
        )
    else:
        lines.append("  budget     none (delete_rate = 0, or not AWS S3): nothing paces deletes")
    lines += [f"  warning    {w}" for w in result.warnings]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{secs}s" if secs else "",
    ]
    return "".join(parts) or f"{seconds:g}s"
