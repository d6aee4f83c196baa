"""Flower on the real stack: behind basic auth, readable task labels, dead letters as failures.

One run (three batches, one refused key, one throttled delete) is watched by one
Flower for both tests: its HTTP API, and its tasks page in headless Chromium,
whose screenshot is the one in the docs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from digest_cleanup.demo.seed import digest_layout_keys, seed_keys
from tests.conftest import REPO_ROOT, s3_targets
from tests.e2e.test_ops import http_request
from tests.rig.faults import FaultProxy
from tests.rig.servers import RedisServer, WeedServer, free_port
from tests.rig.stack import Stack, wait_for
from tests.rig.webdriver import basic_auth, chromium

pytestmark = pytest.mark.e2e

KEYS = digest_layout_keys("statements/", 1200, "2026-10-18")
DENIED = KEYS[5]
FLOWER_AUTH = "ops:flower-e2e-password"
#: The tasks page shows the readable labels (args) and why a task failed.
TASKS_COLUMNS = "name,state,args,exception,received,runtime,worker"
SCREENSHOT = REPO_ROOT / "docs" / "img" / "flower-tasks.png"
BATCH_LABEL = re.compile(r"statements \d{4}-\d\d-\d\d batch [1-3]/~?3 \((500|200|1) keys\)( .+)?")


@dataclasses.dataclass
class Watched:
    """The stack, its Flower, and the run Flower watched."""

    stack: Stack
    port: int
    run: dict[str, Any]
    entries: list[dict[str, Any]]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self, path: str) -> int:
        """The status of an unauthenticated request."""
        return http_request(self.port, path)[0]

    def get(self, path: str) -> Any:
        status, body = http_request(self.port, path, Authorization=basic_auth(FLOWER_AUTH))
        assert status == 200, (path, status, body[:500])
        return json.loads(body) if path.startswith("/api/") else body


@pytest.fixture(scope="module")
def watched(
    redis_server: RedisServer, weed: WeedServer, s3: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Watched]:
    # Given a fresh Redis, a bucket with 1,200 expired keys, and an S3 that refuses one
    if not redis_server.ping():
        redis_server.restart_empty()
    redis.Redis.from_url(redis_server.url).flushall()
    bucket = f"flower-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    seed_keys(weed.endpoint_url, bucket, KEYS)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) >= cutoff, 5, "the clock to pass the cutoff")
    with FaultProxy(weed.endpoint_url) as proxy:
        proxy.deny_keys = {DENIED}
        proxy.slowdown_rate = 1.0  # until one delete has been throttled, see below
        proxy.retry_after = 0
        stack = Stack(
            tmp_path_factory.mktemp("flower"),
            redis_url=redis_server.url,
            s3_endpoint_url=proxy.endpoint_url,
            targets_toml=s3_targets(bucket),
            env={
                "PYTHONPATH": str(REPO_ROOT),
                "CLEANUP_VISIBILITY_TIMEOUT": "30",
                "CLEANUP_RETRY_BASE": "0.2",
                "CLEANUP_RETRY_CAP": "2",
            },
        )
        try:
            # and Flower started the way the deployment files start it, auth from the environment
            port = free_port()
            argv = ["-A", "digest_cleanup", "flower", "--address=127.0.0.1", f"--port={port}"]
            flower_env = {"FLOWER_BASIC_AUTH": FLOWER_AUTH, "FLOWER_TASKS_COLUMNS": TASKS_COLUMNS}
            flower = stack.start("flower", [stack.executable("celery"), *argv], flower_env)
            watched = Watched(stack, port, {}, [])
            wait_for(lambda: _answers(watched, flower), 60, "Flower to answer")
            worker = stack.worker(concurrency=2)
            # Flower only sees events sent after it subscribed: wait until it sees the worker.
            wait_for(
                lambda: any(watched.get("/api/workers?status=1").values()),
                60,
                "Flower to see the worker",
            )

            # When a run deletes the keys, with the first delete throttled once
            started = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
            assert started.code == 0, started
            run_id = started.json()["run_id"]
            wait_for(
                lambda: stack.cli("status", run_id, "--json").json()["retries"] > 0,
                60,
                "a batch to be retried",
            )
            proxy.slowdown_rate = 0.0
            watched.run = wait_for(
                lambda: (
                    (r := stack.cli("status", run_id, "--json").json())["status"] != "running" and r
                ),
                120,
                "the run to end",
            )
            watched.entries = stack.cli("dlq", "list", "--json").json()["entries"]
            assert worker.alive()
            yield watched
        finally:
            stack.stop()


def _answers(watched: Watched, flower: Any) -> bool:
    if not flower.alive():
        raise AssertionError(f"Flower exited:\n{flower.output()}")
    try:
        return watched.status("/healthcheck") == 200
    except OSError:
        return False


def _tasks(watched: Watched) -> dict[str, dict[str, Any]]:
    """Flower's task list, once it has seen every task of the run reach its final state."""
    run_id = watched.run["run_id"]

    def complete() -> dict[str, dict[str, Any]] | None:
        tasks: dict[str, dict[str, Any]] = watched.get("/api/tasks")
        batches = [t for t in tasks.values() if t["uuid"].startswith(f"{run_id}-b")]
        final = len(batches) == 3 and all(t["state"] in ("SUCCESS", "FAILURE") for t in batches)
        return tasks if final else None

    return wait_for(complete, 60, "Flower to see every batch finish", interval=0.5)  # type: ignore[no-any-return]


def test_flower_api_shows_workers_and_readable_tasks_but_never_a_key(watched):
    # The API and the UI are closed without the credentials
    for path in ("/api/tasks", "/api/workers", "/tasks", "/"):
        assert watched.status(path) == 401, path

    # The worker is online, consuming both work queues
    alive = watched.get("/api/workers?status=1")
    assert list(alive.values()) == [True]
    workers = watched.get("/api/workers?refresh=1")
    (info,) = workers.values()
    assert {q["name"] for q in info["active_queues"]} == {"sweeps", "batches"}

    tasks = _tasks(watched)
    run_id = watched.run["run_id"]

    # The sweep and every batch are listed under their clear names
    names = {t["name"] for t in tasks.values()}
    assert {"digest_cleanup.sweep", "digest_cleanup.delete_batch"} <= names
    sweeps = [t for t in tasks.values() if t["name"] == "digest_cleanup.sweep"]
    assert all(run_id in t["args"] and t["state"] == "SUCCESS" for t in sweeps)
    batches = {t["uuid"]: t for t in tasks.values() if t["uuid"].startswith(f"{run_id}-b")}
    assert sorted(batches) == [f"{run_id}-b{n:05d}" for n in (1, 2, 3)]
    # each with a short label, never its keys
    for task in batches.values():
        assert BATCH_LABEL.fullmatch(task["args"]), task["args"]
        assert task["kwargs"] == "{...}"
    # the total is exact once the sweep is done: the last batch was cut at the end of it
    assert batches[f"{run_id}-b00003"]["args"].startswith("statements ")
    assert " batch 3/3 (200 keys)" in batches[f"{run_id}-b00003"]["args"]
    # a retried batch is relabelled with its attempt
    retried = [t for t in batches.values() if t["retried"]]
    assert retried, "no batch was retried"
    assert all(" attempt " in t["args"] for t in retried)

    # The dead-lettered batch is a failure that names its dead-letter entry
    (entry,) = watched.entries
    (failed,) = [t for t in batches.values() if t["state"] == "FAILURE"]
    assert failed["uuid"] == entry["batch_id"]
    assert entry["id"] in failed["exception"]
    assert "DeadLettered" in failed["exception"]
    # and the entry itself was published with a label too, never its keys
    published = tasks[entry["id"]]
    assert published["args"].startswith("dead letter: statements ")
    assert published["kwargs"] == "{...}"

    # No key and no customer identifier appears anywhere in the task JSON
    text = json.dumps(tasks)
    assert "cust-" not in text
    assert not [k for k in KEYS if k in text]

    # Flower lists only the queues workers consume, so the dead-letter depth comes from metrics
    queues = {q["name"]: q["messages"] for q in watched.get("/api/queues/length")["active_queues"]}
    assert set(queues) == {"sweeps", "batches"}
    metrics = watched.stack.cli("metrics", "--json").json()
    (depth,) = metrics["digest_cleanup_dead_letter_depth"]["samples"]
    assert depth["value"] == 1


def test_flower_tasks_page_screenshot(watched, tmp_path):
    _tasks(watched)  # every batch has reached its final state

    # Given headless Chromium driven over chromedriver's W3C HTTP API
    with chromium(tmp_path, stack=watched.stack) as session:
        # When it opens Flower's tasks page with the basic-auth credentials
        session.authenticate(FLOWER_AUTH)
        session.open(watched.url + "/tasks")
        rows = wait_for(
            lambda: [r for r in session.script(ROWS_JS) if "batch" in r],
            60,
            "the tasks table to fill",
            interval=0.5,
        )
        png = session.screenshot()

    # Then the page lists the batches by their labels, and the screenshot is a real PNG
    assert any(re.search(r"statements \S+ batch 3/3 \(200 keys\)", r) for r in rows), rows
    assert any("FAILURE" in r and "dead-lettered as dl-" in r for r in rows), rows
    assert not any("cust-" in r for r in rows)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000
    # The docs' copy is refreshed on request (`make screenshot`), so a test run leaves
    # the work tree as it found it.
    target = (
        SCREENSHOT if os.environ.get("DC_UPDATE_SCREENSHOT") == "1" else tmp_path / SCREENSHOT.name
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(png)


#: The text of each row of the tasks table.
ROWS_JS = (
    "return Array.from(document.querySelectorAll('#tasks-table tbody tr'))"
    ".map(function (row) { return row.innerText; });"
)
