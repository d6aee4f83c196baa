"""A plain ``pip install .`` starts a worker, completes a real run, and runs the demo.

The package goes alone into a fresh virtualenv: no extras, no dev tools.  Its
``celery -A digest_cleanup worker`` and ``digest-cleanup run`` then clean a real S3
bucket through a real Redis.  Those two servers, the seeding and the final listing come
from the development environment that runs this script (``make smoke``), because they
are test tooling, not part of what a user installs.  Then the virtualenv's
``python -m digest_cleanup.demo`` runs a small demo end to end with its own servers,
seeding and processes: only the two server binaries come from outside it, on PATH,
as a user with ``redis-server`` and ``weed`` installed (and no extra) would have them.

    python -m tests.smoke.plain_install              # fresh venv in a temp dir, removed after
    python -m tests.smoke.plain_install --venv DIR   # make DIR once, reuse it on later runs

It prints one line a step and exits 0 when every check passed, else 1 with the reason
and the worker's log.  Every process it starts is stopped on the way out, pass or fail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from tests.rig.servers import RedisServer, WeedServer, find_redis_server, find_weed, s3_client
from tests.smoke.venv import SmokeFailure, check, check_plain, plain_venv, tail, venv_environment

#: The target the smoke run cleans, and where its objects live.
TARGET, BUCKET, PREFIX = "statements", "digest-artifacts", "statements/"
#: Keys older than the cutoff, under the target's prefix: the run must delete these.
EXPIRED = [f"{PREFIX}2026-10-18/cust-{i:06d}.pdf" for i in range(12)]
#: Keys newer than the cutoff, under the prefix: the run must keep these.
FRESH = [f"{PREFIX}2026-11-22/cust-{i:06d}.pdf" for i in range(4)]
#: Old keys outside the prefix: no run of the target may touch these.
OUTSIDE = [f"receipts/2026-10-18/cust-{i:06d}.json" for i in range(3)]
#: Keys per DeleteObjects, small so that the 12 expired keys make 3 batches.
BATCH_SIZE = 5
#: Seconds the worker may take to log that it is ready.
WORKER_READY_TIMEOUT = 60.0
#: Seconds ``run --wait`` may take; a handful of keys needs a second or two.
RUN_TIMEOUT = 60
#: Artifacts the demo seeds: enough for its multi-process seeding, small enough to be quick.
DEMO_KEYS = 3000
#: Seconds the demo may take: servers, seeding, a worker and a run on a shared machine.
DEMO_TIMEOUT = 240

# The objects are seconds old and S3 sets their times, so the cutoff has to fall between
# the expired and the fresh uploads, and a retention window of 0 days is what lets a
# cutoff that recent pass the CLI's check (cutoff <= now - retention_days).
TARGETS_TOML = f"""\
[targets.{TARGET}]
bucket = "{BUCKET}"
prefix = "{PREFIX}"
retention_days = 0
schedule = "0 3 * * 0"
batch_size = {BATCH_SIZE}
"""


def say(message: str) -> None:
    """Print one step's line."""
    print(f"smoke: {message}", flush=True)


def seed(endpoint_url: str) -> datetime:
    """Upload the keys and return a cutoff after every expired one and before every fresh one.

    S3 stamps LastModified itself, to the second, so the cutoff is the second after the
    last expired upload, and the fresh keys go up once the clock has passed it.
    """
    s3 = s3_client(endpoint_url)
    s3.create_bucket(Bucket=BUCKET)
    for key in [*OUTSIDE, *EXPIRED]:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"%PDF-1.7 digest")
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < cutoff + timedelta(milliseconds=50):
        time.sleep(0.05)  # waiting for the wall clock itself, not for another process
    for key in FRESH:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"%PDF-1.7 digest")
    return cutoff


def bucket_keys(endpoint_url: str) -> set[str]:
    """Every key in the bucket."""
    s3 = s3_client(endpoint_url)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}


@contextlib.contextmanager
def worker(venv: Path, env: Mapping[str, str], workdir: Path) -> Iterator[Path]:
    """Run the venv's ``celery -A digest_cleanup worker`` until the block ends; yield its log.

    It starts in ``workdir``, away from the clone, so Celery cannot import the package from
    the current directory, and in its own session, so stopping it reaches its pool too.
    """
    log = workdir / "worker.log"
    argv = [
        str(venv / "bin" / "celery"), "-A", "digest_cleanup", "worker",
        "--loglevel=INFO", "--concurrency=2", "--hostname=smoke@%h",
        "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + WORKER_READY_TIMEOUT
        while "ready." not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise SmokeFailure(f"the worker exited {proc.returncode}:\n{tail(log)}")
            if time.monotonic() > deadline:
                raise SmokeFailure(f"the worker logged no 'ready.' in time:\n{tail(log)}")
            time.sleep(0.1)
        yield log
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the main process (Celery's warm shutdown), then SIGKILL to its group."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the pool's children, if any outlived it
    proc.wait()


def cli(
    venv: Path, env: Mapping[str, str], workdir: Path, *args: str
) -> tuple[int, dict[str, Any]]:
    """Run the venv's ``digest-cleanup ARGS --json``; return its exit code and JSON."""
    argv = [str(venv / "bin" / "digest-cleanup"), *args, "--json"]
    done = subprocess.run(
        argv,
        env=dict(env),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT + 30,
        check=False,
    )
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        raise SmokeFailure(
            f"digest-cleanup {' '.join(args)} exited {done.returncode} without JSON:\n"
            f"{done.stdout}{done.stderr}"
        ) from None
    return done.returncode, answer


def smoke(venv: Path, workdir: Path) -> None:
    """Start the servers, seed them, run the target with the venv's worker and CLI, check."""
    started = time.monotonic()
    with RedisServer() as redis, WeedServer() as weed:
        say(f"redis-server and weed mini ready in {time.monotonic() - started:.1f} s")
        cutoff = seed(weed.endpoint_url)
        say(f"seeded {len(EXPIRED)} expired, {len(FRESH)} fresh, {len(OUTSIDE)} outside")
        targets = workdir / "targets.toml"
        targets.write_text(TARGETS_TOML)
        env = venv_environment(
            venv,
            {
                "CLEANUP_BROKER_URL": redis.url,
                "CLEANUP_S3_ENDPOINT_URL": weed.endpoint_url,
                "CLEANUP_TARGETS_FILE": str(targets),
                "AWS_ACCESS_KEY_ID": "digest-cleanup-smoke",
                "AWS_SECRET_ACCESS_KEY": "digest-cleanup-smoke-secret",
                "AWS_REGION": "us-east-1",
            },
        )
        version = check_plain(venv, env, workdir)
        say(f"digest-cleanup {version} imported from the virtualenv; no extra or dev tool there")
        with worker(venv, env, workdir) as log:
            try:
                run_and_check(venv, env, workdir, cutoff, weed.endpoint_url)
            except SmokeFailure as failure:
                raise SmokeFailure(f"{failure}\nworker log:\n{tail(log)}") from None


def run_and_check(
    venv: Path, env: Mapping[str, str], workdir: Path, cutoff: datetime, endpoint_url: str
) -> None:
    """Run the target to its end, then check the counts, the bucket and ``verify``."""
    say(f"worker ready; running {TARGET} with cutoff {cutoff.isoformat()}")
    iso = cutoff.isoformat()
    code, run = cli(venv, env, workdir, "run", TARGET, "--cutoff", iso, "--wait",
                    "--timeout", str(RUN_TIMEOUT))  # fmt: skip
    check(code == 0, f"run exited {code}: {run}")
    expected = {
        "status": "complete",
        "listed": len(EXPIRED) + len(FRESH),
        "expired": len(EXPIRED),
        "deleted": len(EXPIRED),
        "batches": -(-len(EXPIRED) // BATCH_SIZE),
        "dead_lettered": 0,
        "skipped": 0,
    }
    seen = {field: run.get(field) for field in expected}
    check(seen == expected, f"run {run.get('run_id')}: expected {expected}, got {seen}")
    say(f"run {run['run_id']}: complete, {run['deleted']} deleted in {run['batches']} batches")
    left = bucket_keys(endpoint_url)
    check(not left & set(EXPIRED), f"expired keys still there: {sorted(left & set(EXPIRED))}")
    check(left == {*FRESH, *OUTSIDE}, f"the bucket should hold the fresh and outside keys: {left}")
    code, verify = cli(venv, env, workdir, "verify", TARGET, "--cutoff", iso)
    check(code == 0 and verify.get("remaining_expired") == 0, f"verify exited {code}: {verify}")
    say(f"bucket holds exactly the {len(FRESH)} fresh and {len(OUTSIDE)} outside keys; verify: 0")


def demo(venv: Path, workdir: Path) -> None:
    """Run the venv's ``python -m digest_cleanup.demo`` small; check it ends with a balanced run.

    The server binaries are linked into a directory on the demo's PATH: the demo finds
    them there as it would on a machine that has them installed.
    """
    redis_server, weed = find_redis_server(), find_weed()
    if redis_server is None or weed is None:
        raise SmokeFailure("no redis-server or weed in this environment to lend the demo")
    servers = workdir / "server-binaries"
    servers.mkdir()
    for binary in (redis_server, weed):
        (servers / binary.name).symlink_to(binary.resolve())
    env = venv_environment(venv, {})
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{servers}{os.pathsep}{env['PATH']}"
    argv = [str(venv / "bin" / "python"), "-m", "digest_cleanup.demo"]
    argv += ["--keys", str(DEMO_KEYS), "--workers", "1"]
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, env=env, cwd=workdir, capture_output=True, text=True,
            timeout=DEMO_TIMEOUT, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise SmokeFailure(f"the demo did not end in {DEMO_TIMEOUT} s:\n{exc.stdout}") from None
    output = done.stdout + done.stderr
    check(done.returncode == 0, f"the demo exited {done.returncode}:\n{output[-4000:]}")
    check("Result: OK" in done.stdout, f"the demo's report does not add up:\n{output[-4000:]}")
    seconds = time.monotonic() - started
    say(f"python -m digest_cleanup.demo --keys {DEMO_KEYS}: Result: OK in {seconds:.1f} s")


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    """Turn SIGTERM into SystemExit, so the finally blocks stop what was started."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.smoke.plain_install", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--venv",
        type=Path,
        help="make the virtualenv here and keep it; reused as is when it already has celery",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="digest-cleanup-smoke-"))
    venv = args.venv.resolve() if args.venv else workdir / "venv"
    try:
        started = time.monotonic()
        if (venv / "bin" / "celery").exists():
            say(f"reusing the virtualenv at {venv}")
        else:
            plain_venv(venv, workdir)
            say(
                f"fresh virtualenv, pip install . (no extras) in {time.monotonic() - started:.1f} s"
            )
        started = time.monotonic()
        smoke(venv, workdir)
        demo(venv, workdir)
    except SmokeFailure as failure:
        say(f"FAILED: {failure}")
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    say(f"passed in {time.monotonic() - started:.1f} s after the install")
    return 0


if __name__ == "__main__":
    sys.exit(main())
