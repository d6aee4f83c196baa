"""Shared fixtures: real Redis and S3 servers on free ports, and a process stack.

The servers are started here (never the machine's own Redis on 6379), so no
test depends on what an earlier run left behind.  A missing server binary is a
skip on a laptop, naming the line that installs it, and a failure in CI (``CI=true``).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.rig.faults import FaultProxy
from tests.rig.servers import (
    RedisServer,
    WeedServer,
    required_redis,
    required_weed,
    s3_client,
)
from tests.rig.stack import Stack, wait_for


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = required_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A flushed database on the session's Redis."""
    if not redis_server.ping():  # a test may have killed it on purpose
        redis_server.restart_empty()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedServer]:
    server = required_weed(tmp_path_factory.mktemp("weed"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(weed: WeedServer) -> Any:
    """A boto3 client straight to the S3 server (no faults)."""
    return s3_client(weed.endpoint_url)


@pytest.fixture
def proxy(weed: WeedServer) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the S3 server, fresh for each test."""
    with FaultProxy(weed.endpoint_url) as fp:
        yield fp


_bucket_numbers = itertools.count()
#: Worker processes import test-only kinds (``tests.kinds``) from here.
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"digest-{next(_bucket_numbers)}-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    return name


def put_keys(s3: Any, bucket: str, keys: Iterable[str], body: bytes = b"%PDF-1.7 digest") -> None:
    keys = list(keys)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=body), keys))


def list_keys(s3: Any, bucket: str, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update(o["Key"] for o in page.get("Contents", []))
    return keys


def seed_split(s3: Any, bucket: str, expired: Iterable[str], fresh: Iterable[str]) -> datetime:
    """Upload ``expired``, then ``fresh`` strictly later; return a cutoff between them.

    S3 stamps LastModified itself, at one-second precision, so the cutoff is the
    second after the last expired upload, and fresh uploads wait for the clock
    to pass it.
    """
    put_keys(s3, bucket, expired)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < cutoff + timedelta(milliseconds=50):
        time.sleep(0.05)  # waiting for the wall clock itself, not for another process
    put_keys(s3, bucket, fresh)
    return cutoff


def s3_targets(
    bucket: str, prefix: str = "statements/", name: str = "statements", **extra: Any
) -> str:
    lines = [
        f"[targets.{name}]",
        f'bucket = "{bucket}"',
        f'prefix = "{prefix}"',
        "retention_days = 0",
        'schedule = "0 3 * * 0"',
    ]
    lines.extend(f"{key} = {toml_value(value)}" for key, value in extra.items())
    return "\n".join(lines) + "\n"


def scope_of(stack: Stack, target: str) -> str:
    """The scope digest a batch of ``target`` must carry for the stack's workers."""
    from digest_cleanup.pipeline.runtime import Runtime
    from digest_cleanup.settings import Settings

    return Runtime(Settings.from_env(stack.env)).kind(target).scope_digest


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


@pytest.fixture
def make_stack(tmp_path: Path, redis_url: str, proxy: FaultProxy) -> Iterator[Callable[..., Stack]]:
    """Build a :class:`Stack` whose S3 traffic goes through the fault proxy."""
    stacks: list[Stack] = []

    def make(
        targets_toml: str, env: dict[str, str] | None = None, direct_s3: str | None = None
    ) -> Stack:
        stack = Stack(
            tmp_path / f"stack{len(stacks)}",
            redis_url=redis_url,
            s3_endpoint_url=direct_s3 or proxy.endpoint_url,
            targets_toml=targets_toml,
            env={
                "PYTHONPATH": str(REPO_ROOT),
                "CLEANUP_VISIBILITY_TIMEOUT": "30",
                "CLEANUP_RETRY_BASE": "0.2",
                "CLEANUP_RETRY_CAP": "2",
                **(env or {}),
            },
        )
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.stop()


def run_status(stack: Stack, run_id: str) -> dict[str, Any]:
    """``status RUN --json`` of a run, whatever its status."""
    result = stack.cli("status", run_id, "--json")
    assert result.code in (0, 1, 3), result
    return dict(result.json())


def finished_run(stack: Stack, run_id: str) -> dict[str, Any]:
    """The run's status once it is finalised (its report written or pending)."""
    return dict(
        wait_for(
            lambda: (s := run_status(stack, run_id)).get("finalized_at") and s,
            90,
            f"run {run_id} to finish",
        )
    )


def dlq_entries(stack: Stack) -> list[dict[str, Any]]:
    """Every dead-letter entry, as ``dlq list --json`` shows them."""
    result = stack.cli("dlq", "list", "--json")
    assert result.code == 0, result
    return list(result.json()["entries"])


def sweep_only(stack: Stack, redis_client: Any, cutoff: datetime, batches: int) -> str:
    """Start a run with only a sweep worker, and wait until its batches wait in the queue."""
    sweeper = stack.worker(queues="sweeps", concurrency=1)
    started = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--json")
    assert started.code == 0, started
    wait_for(lambda: redis_client.llen("batches") == batches, 60, f"{batches} queued batches")
    sweeper.stop()
    return str(started.json()["run_id"])
