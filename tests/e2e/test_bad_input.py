"""Bad input on the real stack: refused with a clear reason, nothing deleted, worker still up.

Poison batches that decode (malformed kwargs, unknown target, keys out of scope,
too many keys, unknown run) are covered in ``test_dead_letters.py``; here are the
messages that never decode as a batch at all, and bad configuration at start-up.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection

from digest_cleanup.pipeline.messaging import BATCH_QUEUE
from tests.conftest import list_keys, put_keys, s3_targets, seed_split
from tests.rig.servers import free_port
from tests.rig.stack import Process, Stack, wait_for

pytestmark = pytest.mark.e2e

#: Three targets, so each round after a bad message has keys of its own to delete.
ROUNDS = ("one", "two", "three")


class _Marker:
    """Unpickling this creates a file: proof that a pickle was deserialized."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def _publish_raw(redis_url: str, task_id: str, body: bytes, content_type: str) -> None:
    """Put a message on the batch queue exactly as given, bypassing Celery's serializer."""
    with Connection(redis_url) as conn:
        conn.Producer().publish(
            body,
            exchange="",
            routing_key=BATCH_QUEUE,
            content_type=content_type,
            content_encoding="binary",
            headers={"task": "digest_cleanup.delete_batch", "id": task_id, "lang": "py"},
        )


def _settled(client: redis.Redis, task_id: str) -> bool:
    """The message left the queue and is not held unacknowledged (so never redelivered)."""
    queued = any(task_id.encode() in m for m in client.lrange(BATCH_QUEUE, 0, -1))
    held = any(task_id.encode() in m for m in client.hvals("unacked"))
    return not queued and not held


def _still_consuming(stack: Stack, worker: Process, s3: Any, bucket: str, target: str, cutoff):
    assert worker.alive()
    run = stack.cli("run", target, "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["status"] == "complete"
    assert run["deleted"] == 5
    assert not any(k.startswith(f"{target}/") for k in list_keys(s3, bucket))
    assert worker.alive()


def test_raw_messages_that_never_decode_are_refused_and_the_worker_keeps_consuming(
    make_stack, s3, bucket, proxy, redis_client, redis_url, tmp_path
):
    # Given a worker, and old keys for three targets plus old keys outside every prefix
    keys = [f"{t}/2026-10-18/cust-{i}.pdf" for t in ROUNDS for i in range(5)]
    cutoff = seed_split(s3, bucket, keys, [])
    put_keys(s3, bucket, ["receipts/2026-10-18/keep.json"])
    stack = make_stack("".join(s3_targets(bucket, prefix=f"{t}/", name=t) for t in ROUNDS))
    worker = stack.worker(concurrency=1)
    marker = tmp_path / "unpickled"

    # When a pickle is put on the batch queue, one that would create a file if unpickled
    forged = pickle.dumps(_Marker(marker))
    _publish_raw(redis_url, "forged-pickle", forged, "application/x-python-serialize")

    # Then the worker refuses to deserialize it, logs why, and drops it for good
    wait_for(lambda: "Refusing to deserialize untrusted content" in worker.output(), 60,
             "the refusal in the worker's log")  # fmt: skip
    wait_for(lambda: _settled(redis_client, "forged-pickle"), 60, "the pickle to be dropped")
    assert not marker.exists()
    assert proxy.delete_requests == 0
    _still_consuming(stack, worker, s3, bucket, "one", cutoff)

    # When a message whose body is not JSON at all arrives
    _publish_raw(
        redis_url, "forged-garbage", b'[[], {"base": "one/", "rest": [', "application/json"
    )

    # Then it is refused with the decode error and dropped
    wait_for(lambda: "Can't decode message body: DecodeError" in worker.output(), 60,
             "the decode error in the worker's log")  # fmt: skip
    wait_for(lambda: _settled(redis_client, "forged-garbage"), 60, "the garbage to be dropped")
    assert proxy.delete_requests == 1  # the first round's batch, nothing more
    _still_consuming(stack, worker, s3, bucket, "two", cutoff)

    # When a 10 MB batch message arrives (one 10 MB key prefix, a thousand keys)
    huge = {
        "run_id": "statements-20261122T030000Z",
        "target": "three",
        "batch_id": "forged-huge",
        "seq": 1,
        "cutoff": cutoff.isoformat(),
        "base": "three/" + "x" * 10_000_000,
        "rest": [str(i) for i in range(1000)],
    }
    body = json.dumps([[], huge, {"callbacks": None, "errbacks": None, "chain": None}])
    _publish_raw(redis_url, "forged-huge", body.encode(), "application/json")

    # Then it is dead-lettered as malformed, with an entry of a sane size, and nothing deleted
    entry = wait_for(lambda: redis_client.lindex("dead_letter", 0), 60, "the dead letter")
    assert len(entry) < 200_000
    listed = stack.cli("dlq", "list", "--json").json()["entries"]
    assert [(e["id"], e["reason"]) for e in listed] == [("dl-poison-forged-huge", "malformed")]
    assert proxy.delete_requests == 2  # the two real runs' batches, nothing more
    _still_consuming(stack, worker, s3, bucket, "three", cutoff)
    assert "receipts/2026-10-18/keep.json" in list_keys(s3, bucket)


BAD_TARGETS = {
    "empty prefix": ('prefix = ""', "targets.statements.prefix"),
    "negative retention": ("retention_days = -1", "targets.statements.retention_days"),
    "bad crontab": ('schedule = "0 3 * *"', "targets.statements.schedule"),
    "unknown field": ('colour = "blue"', "unknown field 'colour'"),
}


def _targets_with(line: str) -> str:
    fields = {
        "bucket": 'bucket = "digest-artifacts"',
        "prefix": 'prefix = "statements/"',
        "retention_days": "retention_days = 30",
        "schedule": 'schedule = "0 3 * * 0"',
    }
    fields[line.split(" = ")[0]] = line
    return "[targets.statements]\n" + "\n".join(fields.values()) + "\n"


def _offline_stack(tmp_path: Path, targets_toml: str, broker_url: str) -> Stack:
    """A stack whose broker and S3 are closed ports: nothing here should get that far."""
    return Stack(
        tmp_path / "stack",
        redis_url=broker_url,
        s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
        targets_toml=targets_toml,
    )


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("digest-cleanup:")]


@pytest.mark.parametrize("case", list(BAD_TARGETS))
def test_a_bad_targets_file_stops_cli_and_worker_with_one_line_naming_the_field(
    tmp_path: Path, case: str
) -> None:
    # Given a targets file with one bad field
    line, named = BAD_TARGETS[case]
    broker_url = f"redis://127.0.0.1:{free_port()}/0"

    # When the CLI lists targets, and when a worker starts
    with _offline_stack(tmp_path, _targets_with(line), broker_url) as stack:
        cli = stack.cli("targets")
        worker = stack.worker(ready=False)
        code = worker.proc.wait(60)

    # Then both exit 2 with one line naming the field, and no traceback
    assert cli.code == 2, cli
    assert code == 2, worker.output()
    for output in (cli.stderr, worker.output()):
        (error,) = _error_lines(output)
        assert named in error
        assert "Traceback" not in output


def test_an_unreachable_broker_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    # Given a broker URL with a password, pointing at a port where nothing listens
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"

    # When a worker starts, and when the CLI asks for runs
    with _offline_stack(tmp_path, s3_targets("digest-artifacts"), url) as stack:
        worker = stack.worker(ready=False)
        code = worker.proc.wait(60)
        cli = stack.cli("runs")

    # Then the worker gives up after a few quiet attempts: one line naming the setting
    assert code == 2, worker.output()
    (error,) = _error_lines(worker.output())
    assert "CLEANUP_BROKER_URL=redis://:***@127.0.0.1" in error
    assert "Traceback" not in worker.output()
    assert "Trying again" not in worker.output()  # Celery's endless reconnect never starts
    # and the CLI answers the same way
    assert cli.code == 2, cli
    (error,) = _error_lines(cli.stderr)
    assert "CLEANUP_BROKER_URL" in error
    # and the password is printed nowhere
    assert "hunter2-secret" not in worker.output() + cli.stdout + cli.stderr
