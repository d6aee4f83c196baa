"""What the pipeline is measured against: the raw probe, a tuned script, ``aws s3 rm``, a loop.

* The **raw probe** lists everything, then sends DeleteObjects in 1000-key
  batches over a thread pool: no broker, no run state, no guard, no retries.  It
  lists with the pipeline's own S3 client (the lean listing parser), so the
  comparison isolates what the orchestration costs, and it approximates what
  the server can do.
* The **tuned script** is the usual hand-written version of the same: a stock
  boto3 client, list first, then 1000-key DeleteObjects in 4 threads.
* ``aws s3 rm --recursive`` lists, then deletes one key per DeleteObject request
  (ten at a time by default).
* The **naive loop** lists, then calls DeleteObject for one key after another.

The two slow ones may run on a subset and be extrapolated linearly; the result
says so.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from digest_cleanup.config.settings import Settings
from digest_cleanup.kinds.s3_client import make_client
from digest_cleanup.testing.servers import s3_client

#: Keys per DeleteObjects request in the probe: the most S3 takes.
PROBE_BATCH = 1000
#: Dummy credentials: weed mini with no identities configured accepts any.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret"}


@dataclasses.dataclass(frozen=True)
class Measured:
    """One method's time, possibly on a subset of the keys."""

    method: str
    keys: int
    seconds: float
    #: Phases worth showing apart, such as ``list`` and ``delete``.
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Anything a reader needs to interpret the number.
    note: str = ""
    #: CPU seconds by component while it ran, such as ``weed`` and ``client``.
    cpu: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.keys / self.seconds if self.seconds > 0 else 0.0

    def scaled_to(self, keys: int) -> float:
        """Seconds for ``keys`` keys, extrapolated linearly from this measurement."""
        return self.seconds * keys / self.keys if self.keys else 0.0


def raw_probe(endpoint: str, bucket: str, prefix: str, threads: int) -> Measured:
    """List everything, then DeleteObjects in 1000-key batches over ``threads`` threads.

    It uses the pipeline's own client (:func:`~digest_cleanup.kinds.s3_client.make_client`,
    with its lean listing parser), so it isolates what orchestration costs.  The
    clock includes making the client (about 0.1 s), as a script run for the job
    pays it; the pipeline's workers are long-running and made theirs when they
    started (see ``Runtime.prepare``), before its clock starts.
    """

    def client() -> Any:
        return make_client(
            Settings(
                s3_endpoint_url=endpoint,
                aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            )
        )

    return _list_then_delete(
        f"raw probe (list, then DeleteObjects of {PROBE_BATCH} in {threads} threads)",
        client,
        bucket,
        prefix,
        threads,
    )


def reference_script(endpoint: str, bucket: str, prefix: str, threads: int) -> Measured:
    """The usual hand-written cleanup: stock boto3, list first, then 1000-key deletes."""
    return _list_then_delete(
        f"tuned script (stock boto3: list, then DeleteObjects of {PROBE_BATCH} "
        f"in {threads} threads)",
        lambda: s3_client(endpoint),
        bucket,
        prefix,
        threads,
    )


def _list_then_delete(
    method: str, make: Callable[[], Any], bucket: str, prefix: str, threads: int
) -> Measured:
    started = time.perf_counter()
    cpu_started = time.process_time()
    client = make()
    keys = _list(client, bucket, prefix)
    listed = time.perf_counter()
    chunks = [keys[i : i + PROBE_BATCH] for i in range(0, len(keys), PROBE_BATCH)]

    def delete(chunk: list[str]) -> int:
        response = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
        )
        return len(response.get("Errors", []))

    with ThreadPoolExecutor(threads) as pool:
        errors = sum(pool.map(delete, chunks))
    ended = time.perf_counter()
    if errors:
        raise RuntimeError(f"{method} could not delete {errors} keys from {bucket}")
    return Measured(
        method,
        len(keys),
        ended - started,
        {"list": listed - started, "delete": ended - listed},
        cpu={"client": time.process_time() - cpu_started},
    )


def aws_rm(endpoint: str, bucket: str, prefix: str, workdir: Path) -> Measured:
    """``aws s3 rm --recursive`` against the endpoint, with dummy credentials."""
    keys = len(_list(s3_client(endpoint), bucket, prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= CREDENTIALS | {
        "AWS_DEFAULT_REGION": "us-east-1",
        # No developer profile, credentials file or retry settings leak in.
        "AWS_CONFIG_FILE": str(workdir / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "aws-credentials"),
    }
    argv = [
        *_aws_command(),
        "s3",
        "rm",
        f"s3://{bucket}/{prefix}",
        "--recursive",
        "--only-show-errors",
        "--endpoint-url",
        endpoint,
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"aws s3 rm failed ({done.returncode}): {done.stderr[-2000:]}")
    left = len(_list(s3_client(endpoint), bucket, prefix))
    if left:
        raise RuntimeError(f"aws s3 rm left {left} keys in {bucket}")
    return Measured("aws s3 rm --recursive", keys, seconds)


def naive_loop(endpoint: str, bucket: str, prefix: str) -> Measured:
    """List, then one DeleteObject per key, one after another, with a stock boto3 client."""
    client = s3_client(endpoint)
    started = time.perf_counter()
    keys = _list(client, bucket, prefix)
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    return Measured(
        "naive loop (one DeleteObject per key)", len(keys), time.perf_counter() - started
    )


def _list(client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return keys


def _aws_command() -> list[str]:
    """The AWS CLI of this interpreter if awscli is installed here, else ``aws`` on PATH."""
    import importlib.util

    if importlib.util.find_spec("awscli") is not None:
        return [sys.executable, "-m", "awscli"]
    found = shutil.which("aws")
    if found is None:
        raise RuntimeError("no AWS CLI: pip install awscli (it is in the dev extra)")
    return [found]
