"""Real supervisord with deploy/supervisor/digest-cleanup.conf: a run, a warm stop, no loss.

supervisord runs the shipped file unchanged, included from a throwaway main
config, with its placeholders set to this interpreter's prefix, a temp state
dir and the current user.  Only the worker is started: beat would add catch-up
runs of its own, and Flower, the metrics endpoint and the console listen on fixed
ports that another process on the machine may hold.  S3 traffic goes through the fault
proxy with a delay, so a run of 40 small batches lasts long enough to be
stopped midway.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib.util import find_spec
from pathlib import Path

import psutil
import pytest
import redis

from digest_cleanup.demo.seed import digest_layout_keys, seed_keys
from digest_cleanup.model.run_view import RunView
from digest_cleanup.store.runs import RunStore
from tests.conftest import list_keys
from tests.rig.faults import FaultProxy
from tests.rig.servers import WeedServer, require
from tests.rig.stack import Stack, wait_for
from tests.rig.tools import install_line

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SUPERVISOR_CONF = ROOT / "deploy" / "supervisor" / "digest-cleanup.conf"
WORKER = "digest-cleanup:digest-cleanup-worker-1"
#: Generous: supervisord holds a start for startsecs (10 s), and the machine is shared.
TIMEOUT = 90.0
#: Per S3 request, so one 50-key DeleteObjects takes at least this long.
S3_DELAY = 0.5

EXPIRED = digest_layout_keys("statements/", 2000, "2026-10-18")
FRESH = digest_layout_keys("statements/", 200, "2026-11-22")
SCRATCH = [f"tmp/render-{i:04d}.html" for i in range(100)]
RECEIPTS = [f"receipts/2026-10-18/cust-{i:07d}.json" for i in range(100)]

_RECEIVED = re.compile(r"Task digest_cleanup\.delete_batch\[([^\]]+)\] received")
_SUCCEEDED = re.compile(r"Task digest_cleanup\.delete_batch\[([^\]]+)\] succeeded")


def _targets(bucket: str) -> str:
    return "".join(
        f"[targets.{name}]\n"
        f'bucket = "{bucket}"\n'
        f'prefix = "{name}/"\n'
        "retention_days = 0\n"
        'schedule = "0 3 * * 0"\n'
        "batch_size = 50\n"
        for name in ("statements", "tmp")
    )


class Supervisor:
    """supervisord in the foreground, in its own session, and supervisorctl against it."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        # A short directory for the socket: a Unix socket path may not exceed ~107 bytes.
        self.sockdir = Path(tempfile.mkdtemp(prefix="dc-sv-"))
        self.workdir = workdir
        self.logdir = workdir / "logs"
        self.logdir.mkdir()
        only_worker = workdir / "only-the-worker.conf"
        only_worker.write_text(
            "".join(
                f"[program:digest-cleanup-{name}]\nautostart=false\n"
                for name in ("beat", "flower", "metrics", "console")
            )
        )
        self.conf = workdir / "supervisord.conf"
        self.conf.write_text(
            textwrap.dedent(
                f"""\
                [unix_http_server]
                file={self.sockdir}/supervisor.sock
                [supervisord]
                logfile={workdir}/supervisord.log
                pidfile={workdir}/supervisord.pid
                childlogdir={self.logdir}
                [rpcinterface:supervisor]
                supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
                [supervisorctl]
                serverurl=unix://{self.sockdir}/supervisor.sock
                [include]
                files={SUPERVISOR_CONF} {only_worker}
                """
            )
        )
        self.env = env
        self._out = (workdir / "supervisord.out").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(self.conf)],
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ctl(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.conf), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 2,
            check=False,
        )
        return result.stdout + result.stderr

    def state(self, name: str) -> str:
        words = self.ctl("status", name).split()
        return words[1] if len(words) > 1 else ""

    def worker_log(self) -> Path | None:
        logs = sorted(self.logdir.glob("digest-cleanup-worker-1-stdout*.log"))
        return logs[0] if logs else None

    def worker_output(self) -> str:
        log = self.worker_log()
        return log.read_text(errors="replace") if log else ""

    def main_log(self) -> str:
        path = self.workdir / "supervisord.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Shut supervisord down; kill whatever is left, its programs included."""
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self.proc.pid).children(recursive=True)
        if self.proc.poll() is None:
            self.ctl("shutdown")
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        # Each program runs in its own process group, so killing supervisord's is not enough.
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        self._out.close()
        shutil.rmtree(self.sockdir, ignore_errors=True)


@pytest.fixture
def stack(make_stack, bucket: str) -> Stack:
    """The environment and CLI of a stack; supervisord, not the stack, starts the worker."""
    return make_stack(_targets(bucket))


@pytest.fixture
def supervisor(tmp_path: Path, stack: Stack) -> Iterator[Supervisor]:
    require(
        find_spec("supervisor") is not None,
        "supervisor is not installed",
        install=install_line("supervisord"),
    )
    home = Path(sys.prefix)
    require((home / "bin" / "celery").exists(), f"no celery in {home}/bin")
    state = tmp_path / "state"
    state.mkdir()
    env = {
        **stack.env,
        "DIGEST_CLEANUP_HOME": str(home),
        "DIGEST_CLEANUP_STATE_DIR": str(state),
        "DIGEST_CLEANUP_USER": pwd.getpwuid(os.getuid()).pw_name,
        # Required by the file even though Flower is not started here.
        "FLOWER_BASIC_AUTH": "ops:not-used-here",
        # The file leaves the pool at one process per CPU; two on any machine keep the
        # 40 slow batches running long enough to stop midway (Celery reads CELERY_WORKER_*).
        "CELERY_WORKER_CONCURRENCY": "2",
    }
    workdir = tmp_path / "supervisor"
    workdir.mkdir()
    sv = Supervisor(workdir, env)
    try:
        yield sv
    finally:
        sv.close()


def _seed(weed: WeedServer, bucket: str) -> datetime:
    """Seed everything old, then the fresh statements after a cutoff; return the cutoff."""
    seed_keys(weed.endpoint_url, bucket, EXPIRED + SCRATCH + RECEIPTS)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) > cutoff + timedelta(milliseconds=50), 5, "the clock")
    seed_keys(weed.endpoint_url, bucket, FRESH)
    return cutoff


def _queued_batch_ids(client: redis.Redis) -> set[str]:
    """Batch ids of the messages waiting in the batches queue (peeked, not consumed)."""
    return {json.loads(raw)["headers"]["id"] for raw in client.lrange("batches", 0, -1)}


def test_supervised_worker_runs_stops_warmly_mid_run_and_resumes_losing_nothing(
    supervisor: Supervisor,
    stack: Stack,
    weed: WeedServer,
    proxy: FaultProxy,
    s3,
    bucket: str,
    redis_client: redis.Redis,
) -> None:
    store = RunStore(redis_client)
    cutoff = _seed(weed, bucket).isoformat()

    # Given the worker started by supervisord from the shipped file
    wait_for(lambda: "ready." in supervisor.worker_output(), TIMEOUT, "the worker to be ready")

    # When a run is started, Then the worker completes it
    scratch = stack.cli("run", "tmp", "--cutoff", cutoff, "--wait", "--json", timeout=TIMEOUT)
    assert scratch.code == 0, scratch
    assert scratch.json()["deleted"] == len(SCRATCH)
    assert list_keys(s3, bucket, "tmp/") == set()

    # Given a slow S3 and a run of 40 batches well under way
    proxy.delay = S3_DELAY
    started = stack.cli("run", "statements", "--cutoff", cutoff, "--json")
    run_id = started.json()["run_id"]

    def under_way() -> RunView | None:
        run = store.runs.get(run_id)
        return (
            run if run.fields.get("sweep_done") == "1" and run.count("batches_done") >= 3 else None
        )

    wait_for(under_way, TIMEOUT, "the sweep to finish and the first batches to be deleted")
    # (by now supervisord counts the worker as started: up for longer than startsecs)
    wait_for(lambda: supervisor.state(WORKER) == "RUNNING", TIMEOUT, "supervisord: RUNNING")

    # When supervisorctl stops the worker during the run
    stopped = supervisor.ctl("stop", WORKER)

    # Then it is a warm shutdown: the worker exits by itself (status 0, not SIGKILL)
    assert "stopped" in stopped, stopped
    assert supervisor.state(WORKER) == "STOPPED"
    assert re.search(r"stopped: digest-cleanup-worker-1 \(exit status 0\)", supervisor.main_log())
    output = wait_for(
        lambda: "Warm shutdown" in (out := supervisor.worker_output()) and out,
        TIMEOUT,
        "the worker's log to show the warm shutdown",
    )
    assert "WorkerLostError" not in output
    # The worker prints the line the moment SIGTERM arrives, in order with its log.
    before, _, after = output.partition("Warm shutdown")
    running = set(_RECEIVED.findall(before)) - set(_SUCCEEDED.findall(before))
    finished = set(_SUCCEEDED.findall(after))
    # and a batch that was running when the stop came was allowed to finish
    assert running, "the stop must come while batches are running"
    assert finished & running, "no running batch was allowed to finish"
    # and no batch is lost: each one running was recorded or went back to the queue, and
    # every batch the run still waits for is on the queue, none held by the stopped worker
    run = store.runs.get(run_id)
    pending = {batch for batch, _ in store.runs.in_flight(run_id)}
    queued = _queued_batch_ids(redis_client)
    assert run.status == "running"
    assert pending, "the run must be stopped midway"
    assert pending == queued
    assert redis_client.hlen("unacked") == 0
    for batch in running | set(_RECEIVED.findall(after)):
        assert (batch in finished) != (batch in queued), batch
    assert finished.isdisjoint(pending)
    assert run.count("batches") - run.count("batches_done") == len(pending)

    # When supervisorctl starts it again
    assert "started" in supervisor.ctl("start", WORKER)

    # Then the run completes with nothing lost: every expired key gone, nothing else touched
    done = wait_for(lambda: (r := store.runs.get(run_id)).finished and r, TIMEOUT, "the run to end")
    assert done.status == "complete"
    assert done.count("batches_done") == done.count("batches") == len(EXPIRED) // 50
    assert done.count("deleted") == done.count("expired") == len(EXPIRED)
    assert done.count("dead_lettered") == 0
    assert store.runs.in_flight(run_id) == []
    assert list_keys(s3, bucket, "statements/") == set(FRESH)
    assert list_keys(s3, bucket, "receipts/") == set(RECEIPTS)
    assert not set(proxy.deleted_key_counts) & set(FRESH + RECEIPTS)
