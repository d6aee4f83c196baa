"""The demo's weekly run from start to stop: servers, seeding, workers, the run and verify."""

from __future__ import annotations

import argparse
import signal
import subprocess
from datetime import datetime
from types import FrameType
from typing import NoReturn

from digest_cleanup.demo.artifacts import (
    AUDIT_BUCKET,
    DEFAULT_BUCKET,
    PREFIX,
    TARGET,
    seed_artifacts,
)
from digest_cleanup.demo.embedded import EmbeddedStack
from digest_cleanup.demo.keep import keep_up
from digest_cleanup.demo.phases import Phases, say
from digest_cleanup.demo.report import count_by_prefix, report
from digest_cleanup.demo.seed import create_bucket
from digest_cleanup.demo.stack import Stack
from digest_cleanup.pipeline.lifecycle import run_id_for
from digest_cleanup.settings import DEFAULT_WORKER_THREADS


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    # SIGTERM ends the demo like Ctrl-C does: through the finally that stops everything.
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace) -> int:
    """Start, seed, run, verify and report; stop everything however it ends."""
    embedded = EmbeddedStack()
    # Kept only when something failed, for its logs; an interrupt or a success tidies up.
    keep_files = True
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        ok = _weekly_run(embedded, args)
        keep_files = not ok
        if args.keep:
            keep_up(embedded.stack, embedded.weed.endpoint_url, DEFAULT_BUCKET)
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
        embedded.stop(keep_files=keep_files)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)


def _weekly_run(embedded: EmbeddedStack, args: argparse.Namespace) -> bool:
    """Every phase from starting the servers to the report; True when it all adds up."""
    phases = Phases()
    with phases("start servers"):
        embedded.start_servers()
    endpoint = embedded.weed.endpoint_url
    with phases("seed"):
        seeded = seed_artifacts(endpoint, DEFAULT_BUCKET, args.keys)
        create_bucket(endpoint, AUDIT_BUCKET, exist_ok=True)
        say(
            f"    {seeded.total:,} artifacts: {seeded.expired:,} expired statements, "
            f"{seeded.fresh:,} fresh statements, {seeded.outside:,} receipts outside "
            f"{PREFIX}"
        )
    stack = embedded.configure(DEFAULT_BUCKET)
    with phases("start workers"):
        _start_workers(stack, args.workers, args.concurrency)
    with phases("run"):
        code = _run(stack, seeded.cutoff)
    run = stack.cli("status", run_id_for(TARGET, seeded.cutoff), "--json").json()
    with phases("verify"):
        verify = stack.cli("verify", TARGET, "--cutoff", seeded.cutoff.isoformat(), "--json")
        kept = count_by_prefix(endpoint, DEFAULT_BUCKET)
    report_ok = report(run, verify.json(), kept, seeded)
    say(f"Phases: {phases.summary()}")
    return code == 0 and report_ok and verify.code == 0


def _start_workers(stack: Stack, workers: int, concurrency: int | None) -> None:
    """Start every worker at once, plain as the deploy files do, then wait until each is ready."""
    started = [
        stack.worker(pool=None, concurrency=concurrency, ready=False) for _ in range(workers)
    ]
    for worker in started:
        worker.wait_ready()
    threads = concurrency or DEFAULT_WORKER_THREADS
    say(f"    {workers} worker{'s' if workers != 1 else ''} x {threads} threads")


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
