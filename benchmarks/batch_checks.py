"""What a batch's delete-time checks cost, against the 500-key delete they guard.

Every delivery checks, before it deletes, that its run published the batch with
exactly these keys and conditions (a digest per key in the run store), that each
condition is an ETag, that the run is still running (read again after the budget
wait), and the cutoff against the earliest of three clocks (this host's, Redis's
``TIME``, S3's ``Date``).  This times, against a dedicated Redis and ``weed mini``
on loopback, in the same invocation:

* the sweep's side: the published digest of one 500-key batch;
* the worker's side: every check a delivery runs (old and new), and the new ones alone;
* the baseline: the conditional DeleteObjects of the same 500 keys (objects put back
  before each repetition, not timed).

``python -m benchmarks.batch_checks`` prints the table; ``--update BENCHMARKS.md``
also puts it in that file, replacing the section of an earlier run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.dead_letters import update as update_section
from digest_cleanup.model.batches import BatchPayload, entry_digests, unpublished_keys
from digest_cleanup.pipeline import trusted_clock
from digest_cleanup.pipeline.batch_checks import check_delivery
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.rig.servers import RedisServer, WeedServer, s3_client

#: Keys per batch: the card's 500-key batches.
KEYS = 500
#: Timed repetitions of each measurement; the median is reported.
REPEATS = 25
HEADING = "## What the delete-time checks cost per batch"
RUN = "statements-20261025T0300Z"
TARGETS = """
[targets.statements]
bucket = "bench"
prefix = "statements/"
retention_days = 0
schedule = "0 3 * * 0"
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_checks", description=__doc__)
    parser.add_argument("--update", type=Path, help="replace this section in the given file")
    args = parser.parse_args(argv)
    text = section(measure())
    print(text)
    if args.update:
        update_section(args.update, text, HEADING)
    return 0


def measure() -> dict[str, float]:
    """Median seconds of each measurement."""
    with RedisServer() as redis_server, WeedServer() as weed, tempfile.TemporaryDirectory() as tmp:
        targets = Path(tmp) / "targets.toml"
        targets.write_text(TARGETS)
        settings = Settings(
            broker_url=redis_server.url,
            targets_file=targets,
            s3_endpoint_url=weed.endpoint_url,
            aws_access_key_id="bench",
            aws_secret_access_key="bench-secret",  # noqa: S106 - weed mini accepts any
        )
        s3 = s3_client(weed.endpoint_url)
        s3.create_bucket(Bucket="bench")
        keys = [f"statements/2026-10-18/cust-{i:07d}.pdf" for i in range(KEYS)]
        runtime = Runtime(settings)
        try:
            return _measure(runtime, s3, keys)
        finally:
            runtime.close()


def _measure(runtime: Runtime, s3: Any, keys: list[str]) -> dict[str, float]:
    etags = _put(s3, keys)
    cutoff = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    while datetime.now(UTC) < cutoff + timedelta(milliseconds=50):
        time.sleep(0.05)  # waiting for the wall clock itself: a cutoff must lie in the past
    store, kind = runtime.store, runtime.kind("statements")
    fields = {"target": "statements", "cutoff": cutoff.isoformat(), "scope": kind.scope_digest}
    store.runs.open(RUN, fields)
    token = store.runs.get(RUN).fields["token"]
    payload = BatchPayload(
        run_id=RUN,
        run_token=token,
        target="statements",
        batch_id=f"{RUN}-b00001",
        seq=1,
        cutoff=cutoff.isoformat(),
        keys=keys,
        conditions=[etags[k] for k in keys],
        scope=kind.scope_digest,
    )
    lease = store.sweeps.take_lease(RUN, 600)
    assert lease is not None
    digest = entry_digests(token, keys, payload.conditions)
    checkpoint = {"listed": KEYS, "expired": KEYS, "seq": 1, "done": False}
    store.sweeps.save_checkpoint(RUN, checkpoint, {payload.batch_id: digest}, lease=lease,
                          lease_seconds=600)  # fmt: skip

    def new_checks(_: object) -> None:
        published = store.sweeps.published_digest(RUN, payload.batch_id)
        assert published is not None
        assert not unpublished_keys(published, payload)
        assert all(kind.condition_problem(c) is None for c in payload.conditions)
        trusted_clock.trusted_now(store, kind, target="statements")
        store.runs.run_status(RUN)

    def delete(_: object) -> None:
        results = kind.delete(keys, cutoff, payload.conditions)
        assert all(r.outcome.name == "DELETED" for r in results), results[:3]

    return {
        "published digest (the sweep, once per batch)": _median(
            lambda _: entry_digests(token, keys, payload.conditions)
        ),
        "the new checks alone (the worker, each delivery)": _median(new_checks),
        "every delete-time check (the worker, each delivery)": _median(
            lambda _: check_delivery(runtime, payload)
        ),
        "baseline: the conditional DeleteObjects of the 500 keys": _median(
            delete, lambda: _put(s3, keys)
        ),
    }


def _put(s3: Any, keys: list[str]) -> dict[str, str]:
    return {k: str(s3.put_object(Bucket="bench", Key=k, Body=b"%PDF-1.7")["ETag"]) for k in keys}


def _median(
    operation: Callable[[object], object], setup: Callable[[], object] = lambda: None
) -> float:
    samples = []
    for _ in range(REPEATS):
        subject = setup()
        started = time.perf_counter()
        operation(subject)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def section(results: dict[str, float]) -> str:
    baseline = results["baseline: the conditional DeleteObjects of the 500 keys"]
    lines = [
        HEADING,
        "",
        f"Written by `make bench` (alone: `python -m benchmarks.batch_checks`) on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, against a dedicated Redis and `weed mini` "
        f"on loopback, for one {KEYS}-key batch with its ETags. Medians of {REPEATS} "
        "repetitions, each as a share of the conditional DeleteObjects of the same keys "
        "measured in the same invocation.",
        "",
        "| step | per batch | vs the delete |",
        "|---|---:|---:|",
    ]
    for name, seconds in results.items():
        lines.append(f"| {name} | {seconds * 1000:.2f} ms | {seconds / baseline:.3f}x |")
    lines += [
        "",
        "The new checks are one `HGET` of the batch's published digest (16 bytes a key), "
        f"{KEYS} SHA-256 digests to compare with it, Redis's `TIME`, and one `HMGET` of the "
        "run's status after the budget wait; the sweep stores the digest in the checkpoint "
        "that puts the batch in flight, so it costs no round trip of its own.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
