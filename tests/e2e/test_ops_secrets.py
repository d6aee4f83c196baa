"""No credential, and no customer identifier in clear, leaves the stack through logs or output.

A real stack runs with distinctive AWS keys, a password-protected Redis and a
Flower password, over keys that carry distinctive customer ids.  It goes
through retries, dead letters and a failed run, with one worker logging text at
DEBUG and one logging JSON.  Then every log, every CLI output (errors
included), Flower's task JSON and every dead-letter message is searched.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from digest_cleanup.demo.seed import seed_keys
from tests.conftest import REPO_ROOT, s3_targets
from tests.e2e.test_ops import http_request, start_metrics
from tests.rig.faults import FaultProxy
from tests.rig.servers import RedisServer, WeedServer, free_port
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.e2e

AWS_KEY_ID = "AKIAOPSLEAKCHECK7Q3K"
AWS_SECRET = "Zx9/opsLeakCheck+SECRET/7Q3Kw0rd+AbCdEf0123456789"
REDIS_PASSWORD = "r3dis-Leak-Check-7Q3K"
FLOWER_AUTH = "ops:flower-Leak-Check-7Q3K"
SECRETS = (AWS_KEY_ID, AWS_SECRET, REDIS_PASSWORD, FLOWER_AUTH.partition(":")[2])
#: Customer ids look like ``acct-7Q3K00042``; the key's file name carries them (segment 2).
CUSTOMER = re.compile(r"7Q3K\d{5}")
STATEMENTS = [f"statements/2026-10-18/acct-7Q3K{n:05d}.pdf" for n in range(1200)]
RECEIPTS = [f"receipts/2026-10-18/acct-7Q3K{n:05d}.json" for n in range(90_000, 90_020)]
DENIED = {STATEMENTS[3], STATEMENTS[777]}


def test_no_credential_or_clear_customer_id_in_logs_cli_output_or_dead_letters(
    weed: WeedServer, s3: Any, tmp_path: Path
):
    # Given a password-protected Redis, distinctive AWS keys and customer ids in every key
    server = RedisServer(data_dir=tmp_path / "redis", password=REDIS_PASSWORD)
    server.start()
    bucket = f"leaks-{free_port()}"
    s3.create_bucket(Bucket=bucket)
    seed_keys(weed.endpoint_url, bucket, STATEMENTS + RECEIPTS)
    ahead = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) >= ahead, 5, "the clock to pass the cutoff")
    cutoff = ahead.isoformat()
    targets = s3_targets(bucket) + s3_targets(
        bucket, prefix="receipts/", name="receipts", max_delete=5
    )
    with server, FaultProxy(weed.endpoint_url) as proxy:
        proxy.deny_keys = DENIED
        proxy.slowdown_rate = 1.0  # until a batch has been retried
        proxy.retry_after = 0
        stack = Stack(
            tmp_path / "stack",
            redis_url=server.url,
            s3_endpoint_url=proxy.endpoint_url,
            targets_toml=targets,
            env={
                "PYTHONPATH": str(REPO_ROOT),
                "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
                "FLOWER_BASIC_AUTH": FLOWER_AUTH,
                "CLEANUP_LOG_HASH_SEGMENT": "2",
                "CLEANUP_VISIBILITY_TIMEOUT": "30",
                "CLEANUP_RETRY_BASE": "0.2",
                "CLEANUP_RETRY_CAP": "2",
            },
        )
        with stack:
            outputs = _exercise(stack, proxy, cutoff)
            # Every dead letter as stored: absorbed into the index, or still queued.
            client = redis.Redis.from_url(server.url)
            dead_letters = [
                *client.hvals("dc:dlq:entries"),
                *client.lrange("dead_letter", 0, -1),
            ]
            logs = {p.log.name: p.output() for p in stack.processes}

    # Then the searched texts are the real ones: the runs happened, keys were dead-lettered
    assert len(dead_letters) == 2
    assert "complete_with_failures" in outputs["status --json"]
    assert "max_delete_exceeded" in outputs["run receipts --wait --json"]
    assert any('"event": "batch"' in text for text in logs.values())
    # and the dead-letter listing names the refused keys in clear: it is the operator's
    # tool for "which keys were not deleted", and a redrive needs them
    assert all(key in outputs["dlq list --json"] for key in DENIED)

    # And no credential appears in any log, CLI output, Flower's JSON or dead-letter message
    dead_texts = {f"dead letter {n}": _decode(raw) for n, raw in enumerate(dead_letters)}
    for name, text in {**logs, **outputs, **dead_texts}.items():
        for secret in SECRETS:
            assert secret not in text, f"{name} shows a credential"

    # And no customer id appears in clear anywhere but the dead-letter tools
    by_design = {"dlq list", "dlq list --json", "dlq show --json"}
    for name, text in {**logs, **outputs}.items():
        if name not in by_design:
            found = CUSTOMER.findall(text)
            assert not found, f"{name} shows customer ids {found[:3]}"


def _exercise(stack: Stack, proxy: FaultProxy, cutoff: str) -> dict[str, str]:
    """Run everything that might print a secret or a key; returns each output by command."""
    stack.worker(concurrency=2, extra=["--loglevel=DEBUG"])
    stack.worker(concurrency=1, env={"CLEANUP_LOG_FORMAT": "json"})
    stack.beat()
    flower_port = free_port()
    flower_argv = ["-A", "digest_cleanup", "flower", "--address=127.0.0.1", f"--port={flower_port}"]
    stack.start("flower", [stack.executable("celery"), *flower_argv])
    metrics_port = start_metrics(stack)
    outputs: dict[str, str] = {}

    def cli(name: str, *args: str, env: dict[str, str] | None = None) -> str:
        result = stack.cli(*args, env=env)
        outputs[name] = result.stdout + result.stderr
        return result.stdout

    # A run whose first deletes are throttled until a batch retries, with two refused keys
    started = cli("run statements --json", "run", "statements", "--cutoff", cutoff, "--json")
    run_id = json.loads(started)["run_id"]
    wait_for(
        lambda: json.loads(cli("status --json", "status", run_id, "--json"))["retries"] > 0,
        60,
        "a batch to be retried",
    )
    proxy.slowdown_rate = 0.0
    cli("run statements --wait", "run", "statements", "--cutoff", cutoff, "--wait")
    # and a run that fails its max_delete guard
    cli("run receipts --wait --json", "run", "receipts", "--cutoff", cutoff, "--wait", "--json")
    for args in (
        ("status", run_id),
        ("status", run_id, "--json"),
        ("runs",),
        ("runs", "--json"),
        ("targets", "--json"),
        ("verify", "statements", "--cutoff", cutoff, "--json"),
        ("metrics", "--json"),
        ("dlq", "list"),
        ("dlq", "list", "--json"),
    ):
        cli(" ".join(a for a in args if a not in (run_id, cutoff)), *args)
    entry = json.loads(outputs["dlq list --json"])["entries"][0]["id"]
    cli("dlq show --json", "dlq", "show", entry, "--json")
    outputs["metrics endpoint"] = http_request(metrics_port, "/metrics")[1]
    outputs["flower tasks"] = _flower_tasks(flower_port, run_id)

    # Error messages: the same password, but a broker that is not there
    gone = {"CLEANUP_BROKER_URL": f"redis://:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0"}
    cli("status with no broker", "status", run_id, env=gone)
    assert "cannot reach" in outputs["status with no broker"]
    cli("metrics with no broker", "metrics", "--json", env=gone)
    worker = stack.worker(env=gone, ready=False)
    wait_for(lambda: not worker.alive(), 60, "a worker with no broker to give up")
    assert "cannot reach" in worker.output()
    return outputs


def _flower_tasks(port: int, run_id: str) -> str:
    auth = "Basic " + base64.b64encode(FLOWER_AUTH.encode()).decode()

    def seen() -> str | None:
        try:
            _, text = http_request(port, "/api/tasks", Authorization=auth)
        except OSError:
            return None
        return text if f"{run_id}-b00003" in text else None

    return wait_for(seen, 60, "Flower to list the run's batches", interval=0.5)  # type: ignore[no-any-return]


def _decode(raw: bytes) -> str:
    """A dead-letter message with its base64 body decoded, so a secret cannot hide in it."""
    message = json.loads(raw)
    return raw.decode() + base64.b64decode(message["body"]).decode()
