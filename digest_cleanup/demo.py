"""``make demo``: the whole pipeline on one machine, from nothing to an audited weekly run.

``python -m digest_cleanup.demo`` starts an embedded Redis-compatible server and
``weed mini`` on free loopback ports, seeds synthetic digest artifacts (mostly
expired statements, some fresh ones, and receipts outside the target's prefix),
starts Celery workers, runs the weekly cleanup with live progress, prints the
run report and the ``verify`` result with the time each phase took, and stops
everything it started.  ``--keep`` leaves the stack and Flower up until Ctrl-C.

``python -m digest_cleanup.demo seed --endpoint URL`` only seeds, for a stack
that is already running (the compose file's one-shot ``seed`` service).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from digest_cleanup.pipeline.sweep import run_id_for
from digest_cleanup.testing.seed import create_bucket, digest_layout_keys, seed_keys
from digest_cleanup.testing.servers import LOOPBACK, RedisServer, WeedServer, free_port, s3_client
from digest_cleanup.testing.stack import Stack, wait_for

#: Artifacts seeded by default: one weekly digest of the ~120k-customer product.
DEFAULT_KEYS = 120_000
#: The bucket of the demo, the same name as in the compose stack's targets file.
DEFAULT_BUCKET = "digest-artifacts"
#: Where run reports go; a second bucket, as in production.
AUDIT_BUCKET = "digest-audit"
#: The target the demo runs, and its prefix.
TARGET = "statements"
PREFIX = "statements/"
#: Outside the target's prefix: as old as the expired statements, and never deleted.
OUTSIDE_PREFIX = "receipts/"
#: Shares of the seeded artifacts that are fresh statements and receipts; the rest
#: are expired statements (120k: 110,000 expired, 6,000 fresh, 4,000 receipts).
FRESH_SHARE = 1 / 20
OUTSIDE_SHARE = 1 / 30
#: Keys per DeleteObjects: the most S3 takes in one request.
BATCH_SIZE = 1000
#: How long a real deployment keeps the statements.  Here it only names the weeks in
#: the keys: S3 stamps every object "now", so the demo's target keeps nothing
#: (``retention_days = 0``) and the run's cutoff is taken between the uploads.
RETENTION_DAYS = 35
#: Workers and pool processes: the work is I/O-bound (S3 round trips), so a
#: 2-core machine runs more processes than cores.
DEFAULT_WORKERS = 2
DEFAULT_CONCURRENCY = 3
#: Seconds a started Flower may take to answer its health check.
FLOWER_READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class Seeded:
    """What :func:`seed_artifacts` wrote, and the cutoff that separates expired from fresh."""

    cutoff: datetime
    expired: int
    fresh: int
    outside: int

    @property
    def total(self) -> int:
        return self.expired + self.fresh + self.outside


def split_counts(count: int) -> tuple[int, int, int]:
    """``count`` artifacts as (expired statements, fresh statements, receipts)."""
    fresh = int(count * FRESH_SHARE)
    outside = int(count * OUTSIDE_SHARE)
    return count - fresh - outside, fresh, outside


def seed_artifacts(endpoint: str, bucket: str, count: int, *, versioned: bool = False) -> Seeded:
    """Seed ``count`` artifacts into ``bucket`` and return the cutoff between old and fresh.

    S3 stamps LastModified itself at upload, at one-second precision, so "expired"
    means uploaded before the cutoff: the statements and receipts go first, the
    cutoff is the next second, and the fresh statements go once the clock passed it.
    """
    expired, fresh, outside = split_counts(count)
    today = datetime.now(UTC).date()
    old_week = (today - timedelta(days=RETENTION_DAYS + 7)).isoformat()
    create_bucket(endpoint, bucket, versioning=versioned, exist_ok=True)
    seed_keys(
        endpoint,
        bucket,
        digest_layout_keys(PREFIX, expired, old_week)
        + digest_layout_keys(OUTSIDE_PREFIX, outside, old_week),
    )
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < cutoff + timedelta(milliseconds=50):
        time.sleep(0.05)  # waiting for the wall clock itself to pass the cutoff
    seed_keys(endpoint, bucket, digest_layout_keys(PREFIX, fresh, today.isoformat()))
    return Seeded(cutoff=cutoff, expired=expired, fresh=fresh, outside=outside)


class Phases:
    """Wall-clock time of each named phase, printed as the demo goes and summed at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        say(f"==> {name}")
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - started
            say(f"    {name}: {self.seconds[name]:.1f} s")

    def summary(self) -> str:
        parts = [f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items()]
        return ", ".join(parts) + f"; total {sum(self.seconds.values()):.1f} s"


def say(text: str = "") -> None:
    print(text, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    # SIGTERM ends the demo like Ctrl-C does: through the finally that stops everything.
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace) -> int:
    """Start, seed, run, verify and report; stop everything however it ends."""
    workdir = Path(tempfile.mkdtemp(prefix="digest-cleanup-demo-"))
    phases = Phases()
    redis_server = RedisServer(data_dir=workdir / "redis")
    weed = WeedServer(data_dir=workdir / "weed")
    stack: Stack | None = None
    ok = False
    # Kept only when something failed, for its logs; an interrupt or a success tidies up.
    keep_files = True
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with phases("start servers"):
            redis_server.start()
            weed.start()
            say(f"    redis {redis_server.url}   s3 {weed.endpoint_url}")
        with phases("seed"):
            seeded = seed_artifacts(weed.endpoint_url, DEFAULT_BUCKET, args.keys)
            create_bucket(weed.endpoint_url, AUDIT_BUCKET, exist_ok=True)
            say(
                f"    {seeded.total:,} artifacts: {seeded.expired:,} expired statements, "
                f"{seeded.fresh:,} fresh statements, {seeded.outside:,} receipts outside "
                f"{PREFIX}"
            )
        stack = _stack(workdir, redis_server, weed, DEFAULT_BUCKET)
        with phases("start workers"):
            workers = [stack.worker(concurrency=args.concurrency, ready=False)]
            workers += [
                stack.worker(concurrency=args.concurrency, ready=False)
                for _ in range(args.workers - 1)
            ]
            for worker in workers:
                worker.wait_ready()
            say(f"    {args.workers} workers x {args.concurrency} processes")
        with phases("run"):
            code = _run(stack, seeded.cutoff)
        run = stack.cli("status", run_id_for(TARGET, seeded.cutoff), "--json").json()
        with phases("verify"):
            verify = stack.cli("verify", TARGET, "--cutoff", seeded.cutoff.isoformat(), "--json")
            kept = _count_by_prefix(weed.endpoint_url, DEFAULT_BUCKET)
        report_ok = _report(run, verify.json(), kept, seeded)
        say(f"Phases: {phases.summary()}")
        ok = code == 0 and report_ok and verify.code == 0
        keep_files = not ok
        if args.keep:
            _keep(stack, weed, DEFAULT_BUCKET)
        return 0 if ok else 1
    except KeyboardInterrupt:
        say("\ninterrupted")
        keep_files = False
        return 130
    except (RuntimeError, TimeoutError) as exc:
        # A server, the seeding or a worker did not start: one line, then the clean-up.
        say(f"demo failed: {exc}")
        return 1
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave servers behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("==> stopping everything")
        stopping = time.perf_counter()
        processes = list(stack.processes) if stack is not None else []
        if stack is not None:
            stack.stop()
        weed.stop()
        redis_server.stop()
        left = [p.name for p in processes if p.alive()]
        left += [s.name for s in (weed, redis_server) if s.is_running()]
        say(
            f"    stopped in {time.perf_counter() - stopping:.1f} s; "
            + (f"STILL RUNNING: {', '.join(left)}" if left else "nothing left running")
        )
        if keep_files:
            say(f"    logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)


def _stack(workdir: Path, redis_server: RedisServer, weed: WeedServer, bucket: str) -> Stack:
    targets = (
        f"[targets.{TARGET}]\n"
        'description = "Rendered weekly statements (demo)."\n'
        f'bucket = "{bucket}"\n'
        f'prefix = "{PREFIX}"\n'
        # Every demo object is written moments ago (S3 stamps LastModified itself), so the
        # run's cutoff falls between the uploads, which only a zero retention allows.
        "retention_days = 0\n"
        'schedule = "0 3 * * 0"\n'
        f"batch_size = {BATCH_SIZE}\n"
    )
    # The workers import this package from wherever the demo imported it, even from
    # a source tree that is not installed.
    package_root = str(Path(__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    return Stack(
        workdir / "stack",
        redis_url=redis_server.url,
        s3_endpoint_url=weed.endpoint_url,
        targets_toml=targets,
        env={"PYTHONPATH": pythonpath, "CLEANUP_AUDIT_URL": f"s3://{AUDIT_BUCKET}/reports/"},
    )


def _run(stack: Stack, cutoff: datetime) -> int:
    """``digest-cleanup run --wait`` on this terminal, so its live progress shows.

    The progress goes to stderr; its closing summary on stdout is dropped, since
    the demo prints the report itself.
    """
    argv = [stack.executable("digest-cleanup"), "run", TARGET, "--cutoff", cutoff.isoformat()]
    say(f"    $ digest-cleanup {' '.join(argv[1:])} --wait")
    return subprocess.run(
        [*argv, "--wait"], env=stack.env, stdout=subprocess.DEVNULL, check=False
    ).returncode


def _count_by_prefix(endpoint: str, bucket: str) -> dict[str, int]:
    """How many objects are left under each top-level prefix of ``bucket``."""
    client = s3_client(endpoint)
    counts: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            top = obj["Key"].split("/", 1)[0] + "/"
            counts[top] = counts.get(top, 0) + 1
    return counts


def _seconds_between(start: str, end: str) -> float:
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()


def _report(
    run: dict[str, Any], verify: dict[str, Any], kept: dict[str, int], seeded: Seeded
) -> bool:
    """Print the run report and the verify result; True when everything adds up."""
    duration = _seconds_between(run["created_at"], run.get("ended_at") or run["created_at"])
    rate = run["deleted"] / duration if duration > 0 else 0.0
    left_fresh = kept.get(PREFIX, 0)
    left_outside = kept.get(OUTSIDE_PREFIX, 0)
    rows = [
        ("status", run["status"]),
        ("cutoff", run["cutoff"]),
        ("listed", f"{run['listed']:,}"),
        ("expired", f"{run['expired']:,}"),
        ("deleted", f"{run['deleted']:,}"),
        ("dead_lettered", f"{run['dead_lettered']:,}"),
        ("batches", f"{run['batches']:,} of up to {BATCH_SIZE:,} keys"),
        ("retries", f"{run['retries']:,}"),
        ("duration", f"{duration:.1f} s"),
        ("keys_per_second", f"{rate:,.0f}"),
        ("report", run.get("report_url") or "-"),
    ]
    say()
    say(f"Run {run['run_id']}")
    for name, value in rows:
        say(f"  {name:16} {value}")
    say(f"Verify {verify['target']} {verify['location']} before {verify['cutoff']}")
    say(f"  {'remaining':16} {verify['remaining_expired']:,}")
    say(f"  {'fresh_kept':16} {left_fresh:,} of {seeded.fresh:,}")
    say(f"  {'outside_kept':16} {left_outside:,} of {seeded.outside:,}")
    ok = (
        run["status"] == "complete"
        and run["deleted"] == run["expired"] == seeded.expired
        and verify["remaining_expired"] == 0
        and left_fresh == seeded.fresh
        and left_outside == seeded.outside
    )
    say(f"Result: {'OK' if ok else 'MISMATCH: see above'}")
    return ok


def _keep(stack: Stack, weed: WeedServer, bucket: str) -> None:
    """Start Flower with fresh basic-auth credentials and wait for Ctrl-C."""
    port = free_port()
    # One user:pass without a comma: Flower splits the value on commas.
    auth = f"demo:{secrets.token_urlsafe(12)}"
    stack.start(
        "flower",
        [
            stack.executable("celery"),
            "-A",
            "digest_cleanup",
            "flower",
            f"--address={LOOPBACK}",
            f"--port={port}",
        ],
        # Flower reads FLOWER_BASIC_AUTH itself, so the password stays out of argv.
        env={"FLOWER_BASIC_AUTH": auth},
    )
    url = f"http://{LOOPBACK}:{port}"
    wait_for(lambda: _answers(f"{url}/healthcheck"), FLOWER_READY_TIMEOUT, "Flower to answer")
    say()
    say(f"Flower      {url}   (user {auth.split(':')[0]}, password {auth.split(':', 1)[1]})")
    say(f"S3          {weed.endpoint_url}   (any key pair; bucket {bucket})")
    say("To use the CLI against this stack:")
    for name in ("CLEANUP_BROKER_URL", "CLEANUP_S3_ENDPOINT_URL", "CLEANUP_TARGETS_FILE"):
        say(f"  export {name}={stack.env[name]}")
    say("  export AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo AWS_REGION=us-east-1")
    say(f"  digest-cleanup runs; digest-cleanup verify {TARGET}")
    say("The stack stays up until Ctrl-C.")
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            signal.pause()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback http
            return bool(response.status == 200)
    except OSError:  # URLError and timeouts included
        return False


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
    parser = argparse.ArgumentParser(
        prog="python -m digest_cleanup.demo",
        description="Run the whole pipeline on embedded Redis and S3 servers, then stop them.",
    )
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS, help="artifacts to seed")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="worker processes")
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="pool processes per worker"
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
    args = build_parser().parse_args(argv)
    for name in ("keys", "count", "workers", "concurrency"):
        if getattr(args, name, 1) < 1:
            build_parser().error(f"--{name} must be at least 1")
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
