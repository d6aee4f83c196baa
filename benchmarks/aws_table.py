"""The second table: deleting the weekly run against a model of AWS S3's request-rate limits.

A local ``weed mini`` takes deletes as fast as its CPU allows, so the local table
cannot show what happens past AWS S3's budget: 3,500 writes per second per
prefix, every key of a DeleteObjects one write, and past it ``SlowDown`` in
three forms (a 503, a 200 whose whole body is the error, and per-key entries in
a normal DeleteResult that botocore never retries), with no Retry-After.
:class:`~tests.rig.aws_model.AwsModel` is a proxy in front of the
same ``weed`` that enforces that budget and adds request latency; this table
runs each method through it.

Each row deletes its own fresh copy of the keys, seeded straight into ``weed``
(seeding is not what is measured, and through the model it would be throttled
too), through its own fresh model with the same seed, so every method meets
the same budget from a full bucket of tokens and the same draws of the throttle's
form.  After each run the prefix is listed on ``weed`` itself, past the model, to
count the keys left.

No method can delete N keys in much less than N / 3,500 seconds once it has
listed them, so the **floor** is that plus one listing of the keys through the
model, measured in the same invocation (one stream of pages with the pipeline's
lean client, on the pipeline's copy before it runs, through a model of its own).
The model starts with a second's worth of tokens (its burst), so a method may
come in under the floor by up to a second, which matters only on small runs.
The pipeline holds its workers under one shared budget (``delete_rate`` in the
targets file, set a little under AWS's figure) instead of finding the limit by
being throttled, so it is expected near the floor and rarely throttled; the
others send as fast as they can and retry (or not) what comes back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.alternatives import (
    Measured,
    RetryMode,
    aws_rm,
    count_keys,
    list_keys,
    s5cmd_rm,
    stock_probe,
)
from benchmarks.pipeline import PREFIX, Layout, Runner, RunResult
from digest_cleanup.kinds.s3 import AWS_DELETE_RATE

#: AWS S3's write budget per partitioned prefix, in keys per second: what the model
#: enforces and what the floor is computed from.
AWS_WRITE_RATE = 3500.0
#: The model's seed, the same for every row, so each method meets the same draws.
MODEL_SEED = 0
#: Threads of the stock-boto3 probes: as many as the pipeline's default worker has.
PROBE_THREADS = 64
#: The pipeline's layout against the model: one plain ``celery -A digest_cleanup worker``.
PIPELINE_LAYOUT = "default"
#: Targets of the acceptance lines under the table.
TARGET_FLOOR_RATIO = 1.15
TARGET_THROTTLED_SHARE = 0.05
#: The section's heading in BENCHMARKS.md, so ``--no-local`` can replace it alone.
HEADING = "## Against a model of AWS S3's request-rate limits"


@dataclasses.dataclass(frozen=True)
class ModelRow:
    """One method's run through its own fresh model."""

    method: str
    #: Keys the method was run on (fewer than the table's for ``aws s3 rm``).
    keys: int
    #: Seconds as measured, on ``keys`` keys.
    seconds: float
    #: Share of the delete requests that reached the model and were throttled.
    throttled_share: float
    #: Keys still under the prefix afterwards, listed on the S3 server itself.
    left: int
    #: Keys the pipeline sent to its dead-letter queue; None for the other methods.
    dead_letters: int | None = None
    #: Throttled requests by the form of their answer (``503``, ``200``, ``per_key``).
    throttles: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The most keys the model accepted in any one-second window.
    peak_keys: int = 0
    #: ListObjectsV2 pages the model served during the run.
    list_requests: int = 0
    note: str = ""

    def scaled_to(self, keys: int) -> float:
        """Seconds for ``keys`` keys, extrapolated linearly when run on fewer."""
        return self.seconds * keys / self.keys if self.keys else 0.0


@dataclasses.dataclass
class ModelTable:
    """Everything the table against the model measured."""

    keys: int
    write_rate: float
    #: One listing of the keys through the model: the floor's listing part.
    listing: Measured
    rows: list[ModelRow]
    #: The pipeline's run, for its details.
    pipeline: RunResult
    #: The ``delete_rate`` the pipeline's targets file set.
    delete_rate: float
    started: datetime = dataclasses.field(default_factory=lambda: datetime.now(UTC))

    @property
    def floor(self) -> float:
        """Seconds no method can beat: the keys at the budget, after one listing."""
        return self.keys / self.write_rate + self.listing.seconds

    def ratio(self, row: ModelRow) -> float:
        return row.scaled_to(self.keys) / self.floor if self.floor else 0.0

    @property
    def pipeline_row(self) -> ModelRow:
        return self.rows[0]


def copies(keys: int, cli_keys: int) -> dict[str, int]:
    """The fresh copies the table needs, by bucket: one per row."""
    return {
        "model-pipeline": keys,
        "model-standard": keys,
        "model-adaptive": keys,
        "model-s5cmd": keys,
        "model-aws": min(cli_keys, keys),
    }


def measure(
    store: str,
    redis_url: str,
    server_pids: dict[str, int],
    workdir: Path,
    keys: int,
    *,
    log: Callable[[str], None] = print,
) -> ModelTable:
    """Run every row on its seeded copy (see :func:`copies`), each through its own model.

    ``store`` is the S3 server itself: each model forwards to it, and the keys
    left are counted on it directly.
    """
    from tests.rig.aws_model import AwsModel

    def model() -> Any:
        return AwsModel(store, write_rate=AWS_WRITE_RATE, seed=MODEL_SEED)

    # The default on AWS itself; on a custom endpoint such as the model's there is none.
    rate = AWS_DELETE_RATE
    log("model: one listing through the model (the floor's listing)")
    with model() as lister:
        listing = list_keys(lister.endpoint_url, "model-pipeline", PREFIX)
    if listing.keys != keys:
        raise RuntimeError(f"model-pipeline holds {listing.keys} keys, not {keys}")
    log(f"  {listing.keys:,} keys listed in {listing.seconds:.1f} s")

    rows: list[ModelRow] = []
    layout = Layout.parse(PIPELINE_LAYOUT)
    budget = f"delete_rate = {rate:g}"
    log(f"model: pipeline, {layout.label()}, {budget}")
    with model() as proxy:
        runner = Runner(workdir / "model", redis_url, proxy.endpoint_url, server_pids)
        # Written as the targets file would say it: ``delete_rate = 3300``.
        written = int(rate) if rate == int(rate) else rate
        result = runner.run(layout, "model-pipeline", keys, complete=False, delete_rate=written)
        status = result.run.get("status", "")
        rows.append(
            _row(
                proxy,
                f"pipeline: {result.label()}, {budget}",
                keys,
                result.seconds,
                count_keys(store, "model-pipeline", PREFIX),
                dead_letters=result.dead_lettered,
                note="" if status == "complete" else f"run ended {status}",
            )
        )
    _logged(log, rows[-1])

    modes: tuple[RetryMode, ...] = ("standard", "adaptive")
    for mode in modes:
        bucket = f"model-{mode}"
        log(f"model: stock boto3, {mode} retries, {PROBE_THREADS} threads")
        with model() as proxy:
            probe = stock_probe(proxy.endpoint_url, bucket, PREFIX, PROBE_THREADS, mode)
            note = "list {list:.1f} s, delete {delete:.1f} s".format(**probe.phases)
            if probe.failed:
                note += f"; {probe.failed:,} keys came back as errors and were not retried"
            left = count_keys(store, bucket, PREFIX)
            rows.append(_row(proxy, probe.method, probe.keys, probe.seconds, left, note=note))
        _logged(log, rows[-1])

    log("model: s5cmd rm")
    with model() as proxy:
        s5 = s5cmd_rm(
            proxy.endpoint_url, "model-s5cmd", PREFIX, workdir / "s5cmd", strict=False, store=store
        )
        rows.append(_row(proxy, s5.method, s5.keys, s5.seconds, s5.failed, note=s5.note))
    _logged(log, rows[-1])

    log("model: aws s3 rm --recursive")
    with model() as proxy:
        aws = aws_rm(
            proxy.endpoint_url, "model-aws", PREFIX, workdir / "aws", strict=False, store=store
        )
        note = aws.note
        if aws.keys != keys:
            note = f"measured on {aws.keys:,} keys, extrapolated" + (f"; {note}" if note else "")
        rows.append(_row(proxy, aws.method, aws.keys, aws.seconds, aws.failed, note=note))
    _logged(log, rows[-1])
    return ModelTable(keys, AWS_WRITE_RATE, listing, rows, result, rate)


def _row(
    proxy: Any,
    method: str,
    keys: int,
    seconds: float,
    left: int,
    *,
    dead_letters: int | None = None,
    note: str = "",
) -> ModelRow:
    """A row from a finished run and what its model counted."""
    return ModelRow(
        method=method,
        keys=keys,
        seconds=seconds,
        throttled_share=float(proxy.throttled_share()),
        left=left,
        dead_letters=dead_letters,
        throttles={str(k): int(v) for k, v in dict(proxy.throttles_by_form()).items()},
        peak_keys=int(proxy.max_window_keys(1.0)),
        list_requests=int(proxy.list_requests),
        note=note,
    )


def _logged(log: Callable[[str], None], row: ModelRow) -> None:
    rate = row.keys / row.seconds if row.seconds else 0.0
    log(
        f"  {row.keys:,} keys in {row.seconds:.1f} s ({rate:,.0f} keys/s), "
        f"{row.throttled_share:.1%} of deletes throttled, {row.left:,} left"
    )
