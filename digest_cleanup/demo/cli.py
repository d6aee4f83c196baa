"""The demo's command line: ``python -m digest_cleanup.demo [seed]`` and its options."""

from __future__ import annotations

import argparse
import time

from digest_cleanup.demo.artifacts import AUDIT_BUCKET, DEFAULT_BUCKET, TARGET, seed_artifacts
from digest_cleanup.demo.phases import say
from digest_cleanup.demo.seed import create_bucket
from digest_cleanup.demo.weekly import run_demo
from digest_cleanup.settings import DEFAULT_WORKER_THREADS

#: Artifacts seeded by default: one weekly digest of the ~120k-customer product.
DEFAULT_KEYS = 120_000
#: Workers: one plain ``celery -A digest_cleanup worker``, as the deploy files start it
#: (the threads pool, DEFAULT_WORKER_THREADS threads).
DEFAULT_WORKERS = 1


def run_seed(args: argparse.Namespace) -> int:
    """Seed a running S3 server and say which cutoff cleans up what was seeded."""
    started = time.perf_counter()
    seeded = seed_artifacts(args.endpoint, args.bucket, args.count, versioned=args.versioned)
    create_bucket(args.endpoint, args.audit_bucket, exist_ok=True)
    say(
        f"seeded {seeded.total:,} artifacts into {args.bucket} in "
        f"{time.perf_counter() - started:.1f} s: {seeded.expired:,} statements uploaded before "
        f"{seeded.cutoff.isoformat()}, {seeded.fresh:,} after it, {seeded.outside:,} receipts"
    )
    cutoff = seeded.cutoff.isoformat()
    say(f"clean them up with: digest-cleanup run {TARGET} --cutoff {cutoff} --wait")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The demo's options, and the ``seed`` command's."""
    parser = argparse.ArgumentParser(
        prog="python -m digest_cleanup.demo",
        description="Run the whole pipeline on embedded Redis and S3 servers, then stop them.",
    )
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS, help="artifacts to seed")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="worker processes")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help=f"threads per worker (default: a plain worker's {DEFAULT_WORKER_THREADS})",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the stack and Flower up until Ctrl-C"
    )
    parser.set_defaults(handler=run_demo)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    seed = sub.add_parser("seed", help="only seed a running S3 server (the compose demo)")
    seed.add_argument("--endpoint", required=True, help="the S3 endpoint, e.g. http://s3:8333")
    seed.add_argument("--bucket", default=DEFAULT_BUCKET)
    seed.add_argument("--audit-bucket", default=AUDIT_BUCKET, help="created for run reports")
    seed.add_argument("--count", type=int, default=20_000, help="artifacts to seed")
    seed.add_argument("--versioned", action="store_true", help="turn on bucket versioning")
    seed.set_defaults(handler=run_seed)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo, or the ``seed`` command, as the command line asks; its exit status."""
    args = build_parser().parse_args(argv)
    for name in ("keys", "count", "workers", "concurrency"):
        if (getattr(args, name, 1) or 1) < 1:
            build_parser().error(f"--{name} must be at least 1")
    return int(args.handler(args))
