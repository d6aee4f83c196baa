"""Fast seeding of many small objects into a ``weed mini`` (or any S3 that takes anonymous PUTs).

boto3 spends about 2 ms of CPU per PUT (signing, checksums, parsing), which caps
one process at roughly 480 PUT/s.  :func:`seed_keys` instead sends bare HTTP/1.1
PUTs over kept-alive connections from several worker processes, each with a few
threads.  The requests are unsigned: ``weed mini`` with no IAM configured accepts
anonymous writes.  A server that demands signatures answers 403, which
:func:`seed_keys` reports as a :class:`SeedError`.

The workers are fresh interpreters (``python -m digest_cleanup.demo.seed JOB``)
rather than :mod:`multiprocessing` children: forking a caller that already
runs threads (a test's proxies, Celery workers) can deadlock, and the spawn method would
re-run an unguarded ``__main__`` script of the caller.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from urllib.parse import quote, urlsplit

from digest_cleanup.demo.servers import s3_client

__all__ = [
    "DEFAULT_BODY",
    "SeedError",
    "SeedStats",
    "create_bucket",
    "digest_layout_keys",
    "seed_keys",
]

#: The body of every seeded object unless the caller gives one: small, like a stub PDF.
DEFAULT_BODY = b"%PDF-1.4\n% digest-cleanup demo artifact\n"
#: Below this many keys per process, starting another process costs more than it saves.
_MIN_KEYS_PER_PROCESS = 1_000
#: Attempts per key before it counts as failed (connection errors and 5xx are retried).
_ATTEMPTS_PER_KEY = 4
#: How many failures a :class:`SeedError` quotes.
_QUOTED_FAILURES = 5
#: The module the worker processes run; ``__name__`` is ``__main__`` inside them.
_WORKER_MODULE = "digest_cleanup.demo.seed"


class SeedError(RuntimeError):
    """Some objects could not be written; the message quotes the first failures."""


@dataclass(frozen=True)
class SeedStats:
    """How many objects a seeding call wrote, and how long it took (wall clock)."""

    count: int
    seconds: float

    @property
    def rate(self) -> float:
        """Objects written per second."""
        return self.count / self.seconds if self.seconds > 0 else 0.0


class _Result(TypedDict):
    """What one worker reports back."""

    written: int
    failed: int
    failures: list[str]


def digest_layout_keys(prefix: str, count: int, week: str, start: int = 0) -> list[str]:
    """Return ``count`` keys shaped like one week's digest artifacts.

    ``digest_layout_keys("statements/", 2, "2026-11-22")`` gives
    ``["statements/2026-11-22/cust-0000000.pdf", "statements/2026-11-22/cust-0000001.pdf"]``;
    ``start`` shifts the numbering so that several calls make disjoint sets.
    """
    return [f"{prefix}{week}/cust-{i:07d}.pdf" for i in range(start, start + count)]


def create_bucket(
    endpoint_url: str,
    bucket: str,
    *,
    versioning: bool = False,
    exist_ok: bool = False,
) -> None:
    """Create ``bucket``, optionally with versioning.

    With ``exist_ok`` an existing bucket is accepted as is (its versioning is not
    checked).  Bucket-level calls are few, so they go through boto3.
    """
    from botocore.exceptions import ClientError

    client = s3_client(endpoint_url)
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code")
        # weed answers BucketAlreadyExists even for the caller's own bucket.
        if not exist_ok or code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
        client.head_bucket(Bucket=bucket)
        return
    if versioning:
        client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def seed_keys(
    endpoint_url: str,
    bucket: str,
    keys: Iterable[str],
    *,
    body: bytes = DEFAULT_BODY,
    processes: int = 4,
    threads_per_process: int = 4,
    timeout: float = 600.0,
) -> SeedStats:
    """PUT one object per key, with the same ``body``, as fast as the server takes them.

    Work is split over up to ``processes`` worker processes (fewer for small sets:
    each gets at least a thousand keys; with one, the calling process does
    the work) of ``threads_per_process`` connections each.  Raises
    :class:`SeedError` if any key still fails after retries, and
    :class:`subprocess.TimeoutExpired` if the workers take longer than ``timeout``.
    """
    key_list = list(keys)
    started = time.perf_counter()
    if not key_list:
        return SeedStats(count=0, seconds=0.0)
    worker_count = max(1, min(processes, math.ceil(len(key_list) / _MIN_KEYS_PER_PROCESS)))
    if worker_count == 1:
        results = [_put_all(endpoint_url, bucket, key_list, body, threads_per_process)]
    else:
        shares = [key_list[i::worker_count] for i in range(worker_count)]
        results = _run_workers(endpoint_url, bucket, shares, body, threads_per_process, timeout)
    seconds = time.perf_counter() - started
    failed = sum(result["failed"] for result in results)
    if failed:
        quoted = [line for result in results for line in result["failures"]][:_QUOTED_FAILURES]
        raise SeedError(
            f"{failed} of {len(key_list)} objects could not be written to {bucket!r} at "
            f"{endpoint_url}; first failures:\n" + "\n".join(quoted)
        )
    return SeedStats(count=sum(result["written"] for result in results), seconds=seconds)


def _run_workers(
    endpoint_url: str,
    bucket: str,
    shares: Sequence[list[str]],
    body: bytes,
    threads: int,
    timeout: float,
) -> list[_Result]:
    """Run one worker process per share of keys and collect their reports."""
    # The workers import this package from wherever the caller imported it, even
    # when that is a source tree that is not installed.
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="digest-cleanup-seed-") as job_dir:
        workers: list[subprocess.Popen[bytes]] = []
        try:
            for index, share in enumerate(shares):
                # A job file, not stdin: every worker starts at once, and none waits for
                # the parent to finish writing the previous one's input.
                job = Path(job_dir) / f"job-{index}.json"
                job.write_text(
                    json.dumps(
                        {
                            "endpoint_url": endpoint_url,
                            "bucket": bucket,
                            "keys": share,
                            "body": base64.b64encode(body).decode("ascii"),
                            "threads": threads,
                        }
                    ),
                    encoding="utf-8",
                )
                workers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", _WORKER_MODULE, str(job)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        env=env,
                    )
                )
            deadline = time.monotonic() + timeout
            return [_collect(worker, max(0.0, deadline - time.monotonic())) for worker in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()


def _collect(worker: subprocess.Popen[bytes], timeout: float) -> _Result:
    """Wait for one worker and parse its report; a crash becomes a :class:`SeedError`."""
    stdout, stderr = worker.communicate(timeout=timeout)
    if worker.returncode != 0:
        raise SeedError(
            f"seed worker exited with code {worker.returncode}:\n"
            + stderr.decode("utf-8", errors="replace")[-2000:]
        )
    result: _Result = json.loads(stdout)
    return result


def _put_all(
    endpoint_url: str, bucket: str, keys: Sequence[str], body: bytes, threads: int
) -> _Result:
    """PUT every key from ``threads`` threads, one kept-alive connection each."""
    parts = urlsplit(endpoint_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"endpoint_url must be http://host:port, not {endpoint_url!r}")
    host, port = parts.hostname, parts.port or 80
    thread_count = max(1, min(threads, len(keys)))
    results: list[_Result] = []
    results_lock = threading.Lock()

    def run(share: Sequence[str]) -> None:
        result = _put_share(host, port, bucket, share, body)
        with results_lock:
            results.append(result)

    workers = [
        threading.Thread(target=run, args=(keys[i::thread_count],), name=f"seed-{i}")
        for i in range(thread_count)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {
        "written": sum(r["written"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "failures": [line for r in results for line in r["failures"]][:_QUOTED_FAILURES],
    }


def _put_share(host: str, port: int, bucket: str, keys: Sequence[str], body: bytes) -> _Result:
    """PUT ``keys`` one after another over one connection, retrying each a few times."""
    headers = {"Content-Length": str(len(body)), "Content-Type": "application/octet-stream"}
    bucket_path = "/" + quote(bucket, safe="")
    connection = http.client.HTTPConnection(host, port, timeout=60)
    written = failed = 0
    failures: list[str] = []
    try:
        for key in keys:
            path = f"{bucket_path}/{quote(key, safe='/')}"
            problem = ""
            for _attempt in range(_ATTEMPTS_PER_KEY):
                try:
                    connection.request("PUT", path, body=body, headers=headers)
                    response = connection.getresponse()
                    answer = response.read()
                except (OSError, http.client.HTTPException) as error:
                    # Most likely an idle kept-alive connection the server closed.
                    connection.close()
                    problem = repr(error)
                    continue
                if response.status < 300:
                    problem = ""
                    break
                problem = f"HTTP {response.status}: {answer[:300]!r}"
                # 4xx (NoSuchBucket, AccessDenied) will not change on a retry.
                if response.status < 500:
                    break
            if problem:
                failed += 1
                if len(failures) < _QUOTED_FAILURES:
                    failures.append(f"{key}: {problem}")
            else:
                written += 1
    finally:
        connection.close()
    return {"written": written, "failed": failed, "failures": failures}


def _worker_main(argv: Sequence[str]) -> int:
    """Entry point of a worker process: read the job file, PUT its keys, print a report."""
    if len(argv) != 1:
        print(f"usage: python -m {_WORKER_MODULE} JOB_FILE", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = _put_all(
        job["endpoint_url"],
        job["bucket"],
        job["keys"],
        base64.b64decode(job["body"]),
        int(job["threads"]),
    )
    with contextlib.suppress(BrokenPipeError):
        json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker_main(sys.argv[1:]))
