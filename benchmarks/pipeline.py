"""Run the real pipeline once and watch it: worker processes, Redis, S3, the run store.

A run is started the way ``digest-cleanup run`` starts it
(:func:`~digest_cleanup.pipeline.lifecycle.start` with the sweep enqueued on the broker)
while the workers are already up, and the clock stops at the run's own
``ended_at``, written by the script that finishes it.
Meanwhile a sampler reads the run and the batch queue ten times a second until
the sweep is done, then once a second: when the guard pass ended (the first batch
published), when the sweep was done, and whether the delete slots ever waited for
the sweep.  The watching is kept cheap (one round trip per sample, the S3
connections looked at once a second), since on a small machine it shares the CPU
with the pipeline it measures.

Each worker's pool and concurrency are read off its startup banner rather than
assumed, so the ``default`` layout (``celery -A digest_cleanup worker`` with no
options) is reported as whatever the app configures, and so are the cores each
worker and pool process may run on.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from benchmarks.environment import affinity, children, client_ports, cpu_seconds, memory_kib
from digest_cleanup.app import create_app
from digest_cleanup.clock import epoch_of
from digest_cleanup.model.run_view import FINAL_STATUSES
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.messaging import BATCH_QUEUE, SWEEP_QUEUE
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.store.runs import RunStore
from tests.rig.stack import Process, Stack

#: Seconds between samples of the run and the queue while the sweep publishes.
SAMPLE_SECONDS = 0.1
#: Seconds between samples once the sweep is done: the queue only drains from then
#: on, and kept-alive S3 connections last the whole run, so a look a second sees
#: them all.
SETTLED_SAMPLE_SECONDS = 1.0
#: Samples between two looks at the S3 connections while the sweep publishes.
CONNECTION_EVERY = 10
#: Seconds between two looks at the run's status while waiting for it to end.  The
#: time is read off the run's own ``ended_at``, so this only bounds how long the
#: benchmark notices late; the watching must stay cheap, since it shares the CPU
#: with the pipeline it measures.
WAIT_POLL_SECONDS = 0.1
#: The target every benchmark run cleans.
TARGET = "statements"
#: Where the digest artifacts live in each bucket.
PREFIX = "statements/"
#: The longest a single benchmark run may take before it is called stuck.
RUN_TIMEOUT = 1800.0
#: A worker's startup banner line, such as ``.> concurrency: 64 (thread)``.
_BANNER_POOL = re.compile(r"concurrency:\s+(\d+)\s+\((\w+)\)")


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """One ``celery worker`` process: its queues, pool and concurrency (None: Celery's default)."""

    queues: str | None = None
    pool: str | None = None
    concurrency: int | None = None

    @property
    def deletes(self) -> bool:
        return self.queues in (None, BATCH_QUEUE)

    def argv(self, hostname: str) -> list[str]:
        argv = ["worker", "--loglevel=INFO", f"--hostname={hostname}@%h"]
        argv += ["--without-mingle", "--without-gossip"]
        if self.pool:
            argv.append(f"--pool={self.pool}")
        if self.concurrency:
            argv.append(f"--concurrency={self.concurrency}")
        if self.queues:
            argv.append(f"--queues={self.queues}")
        return argv

    def label(self, observed: str = "") -> str:
        """Queues, pool and concurrency; ``observed`` (from the banner) fills what is unset."""
        where = f"{self.queues}: " if self.queues else ""
        if observed and not (self.pool and self.concurrency):
            return f"{where}{observed}"
        pool = self.pool or "app's pool"
        size = str(self.concurrency) if self.concurrency else "default"
        return f"{where}{pool} {size}"


@dataclasses.dataclass(frozen=True)
class Layout:
    """The worker processes of one deployment, such as ``sweeps:prefork:1+batches:threads:8``."""

    spec: str
    workers: tuple[WorkerSpec, ...]
    #: The target's ``batch_size``; None keeps the targets file's default.
    batch_size: int | None = None
    #: False sends deletes without their listed ETags (``conditional_deletes = false``),
    #: to measure what the condition costs.
    conditional: bool = True

    @classmethod
    def parse(cls, spec: str) -> Layout:
        """``default`` or ``[N*]QUEUES:POOL:CONCURRENCY`` joined with ``+``, then ``@BATCH``.

        QUEUES is ``all``, ``sweeps`` or ``batches``; POOL and CONCURRENCY may be
        ``default``.  ``2*all:prefork:4`` is two workers of four processes each, a
        trailing ``@1000`` sets the target's batch size, and a final ``!unconditional``
        turns the target's conditional deletes off.
        """
        layout_spec, _, flag = spec.partition("!")
        if flag not in ("", "unconditional"):
            raise ValueError(f"{spec!r}: the only flag is !unconditional")
        workers_spec, _, batch = layout_spec.partition("@")
        batch_size = int(batch) if batch else None
        conditional = flag != "unconditional"
        if workers_spec == "default":
            return cls(spec, (WorkerSpec(),), batch_size, conditional)
        workers: list[WorkerSpec] = []
        for part in workers_spec.split("+"):
            count, _, rest = part.rpartition("*")
            fields = rest.split(":")
            if len(fields) != 3:
                raise ValueError(f"{part!r}: expected QUEUES:POOL:CONCURRENCY")
            queues, pool, size = fields
            if queues not in ("all", SWEEP_QUEUE, BATCH_QUEUE):
                raise ValueError(f"{part!r}: queues must be all, {SWEEP_QUEUE} or {BATCH_QUEUE}")
            worker = WorkerSpec(
                queues=None if queues == "all" else queues,
                pool=None if pool == "default" else pool,
                concurrency=None if size == "default" else int(size),
            )
            workers.extend([worker] * int(count or 1))
        return cls(spec, tuple(workers), batch_size, conditional)

    def label(self, pools: Sequence[str] = ()) -> str:
        """What the layout runs; ``pools`` (per worker, from the banners) fill in what it leaves."""
        batch = f", batch_size {self.batch_size}" if self.batch_size else ""
        if not self.conditional:
            batch += ", unconditional deletes"
        if self.spec.partition("!")[0].partition("@")[0] == "default":
            seen = f" ({', '.join(pools)})" if pools else ""
            return f"default: 1 worker, no options{seen}{batch}"
        observed = list(pools) if len(pools) == len(self.workers) else [""] * len(self.workers)
        counted: dict[str, int] = {}
        for worker, pool in zip(self.workers, observed, strict=True):
            counted[worker.label(pool)] = counted.get(worker.label(pool), 0) + 1
        return " + ".join(f"{n} x {w}" if n > 1 else w for w, n in counted.items()) + batch


@dataclasses.dataclass
class RunResult:
    """Everything measured about one pipeline run."""

    layout: Layout
    keys: int
    seconds: float
    run: dict[str, str]
    #: Seconds from the trigger to the first batch published: the guard pass's cost.
    guard_seconds: float
    #: Seconds from the trigger until the sweep had published every batch.
    sweep_seconds: float
    #: Share of samples, while the sweep was still publishing, with fewer batches
    #: in flight than delete slots: workers waiting for the sweep.
    starved_share: float
    max_queue_depth: int
    #: Per worker: main process and pool children, (current, peak) RSS in KiB.
    memory: list[dict[str, tuple[int, int]]]
    #: RSS of the sweep's pool process before the run (KiB), when a worker serves sweeps only.
    sweep_baseline_kib: int | None
    sweep_peak_kib: int | None
    #: CPU seconds during the run, by component.
    cpu: dict[str, float]
    #: (attempt s, delete s, items) of every batch attempt, from the run store.
    timings: list[tuple[float, float, int]]
    message_bytes: int | None
    message_body_bytes: int | None
    #: Distinct client connections to S3 seen during the run (connection reuse).
    s3_connections: int
    #: Per worker, its pool and concurrency as its banner gave them, such as ``threads 64``.
    pools: list[str] = dataclasses.field(default_factory=list)
    #: The cores the workers and their pool processes were allowed to run on.
    worker_cores: frozenset[int] = frozenset()

    @property
    def rate(self) -> float:
        return self.keys / self.seconds if self.seconds else 0.0

    @property
    def dead_lettered(self) -> int:
        """Keys the run gave up on and sent to the dead-letter queue."""
        return int(self.run.get("dead_lettered") or 0)

    def label(self) -> str:
        """The layout, with the pools and concurrency its workers' banners gave."""
        return self.layout.label(self.pools)

    def overhead(self) -> tuple[float, float]:
        """Median and p95 of (attempt wall time minus the DeleteObjects call), in seconds."""
        return _median_p95([a - d for a, d, _ in self.timings])

    def delete_call(self) -> tuple[float, float]:
        """Median and p95 of the DeleteObjects call itself, in seconds."""
        return _median_p95([d for _, d, _ in self.timings])


def targets_toml(bucket: str, **extra: Any) -> str:
    """The targets file of a benchmark run: every digest under the prefix is in scope."""
    lines = [
        f"[targets.{TARGET}]",
        f'bucket = "{bucket}"',
        f'prefix = "{PREFIX}"',
        "retention_days = 0",
        'schedule = "0 3 * * 0"',
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


class Runner:
    """Runs the pipeline against one Redis and one S3 endpoint, one layout at a time."""

    def __init__(
        self, workdir: Path, redis_url: str, endpoint: str, server_pids: dict[str, int]
    ) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.endpoint = endpoint
        self.server_pids = server_pids
        self._count = 0

    def run(
        self,
        layout: Layout,
        bucket: str,
        keys: int,
        *,
        dry_run: bool = False,
        complete: bool = True,
        **target: Any,
    ) -> RunResult:
        """Start the workers, trigger one run over ``bucket``, wait for it, and measure.

        ``target`` adds fields to the target's table (such as ``delete_rate``).  A
        run that ends other than ``complete`` raises, unless ``complete`` is False:
        against the model of AWS S3, how a run ends is part of what is measured.
        """
        client = redis.Redis.from_url(self.redis_url)
        client.flushall()
        self._count += 1
        workdir = self.workdir / f"run{self._count}"
        if layout.batch_size:
            target.setdefault("batch_size", layout.batch_size)
        if not layout.conditional:
            target.setdefault("conditional_deletes", False)
        with Stack(
            workdir,
            redis_url=self.redis_url,
            s3_endpoint_url=self.endpoint,
            targets_toml=targets_toml(bucket, **target),
            env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        ) as stack:
            workers = [self._worker(stack, spec, i) for i, spec in enumerate(layout.workers)]
            sweeper = next(
                (w for w, s in zip(workers, layout.workers, strict=True) if not s.deletes), None
            )
            time.sleep(1.0)  # pool processes finish importing before the baseline is read
            sweep_child = children(sweeper.pid)[0] if sweeper and children(sweeper.pid) else None
            baseline = memory_kib(sweep_child)[0] if sweep_child else None
            banners = [_pool(w) for w in workers]
            slots = sum(n for (_, n), s in zip(banners, layout.workers, strict=True) if s.deletes)
            cores = frozenset().union(
                *(affinity(p) for w in workers for p in (w.pid, *children(w.pid)))
            )
            settings = Settings.from_env(stack.env)
            runtime = Runtime(settings)
            create_app(settings, runtime.targets, runtime=runtime)
            pids = {"weed": self.server_pids["weed"], "redis": self.server_pids["redis"]}
            cpu_before = _cpu(pids, workers)
            # Every key was seeded before the workers started, seconds ago, so every key
            # has expired; a cutoff ahead of the clock would be refused.
            cutoff = datetime.now(UTC).replace(microsecond=0)
            started = time.perf_counter()
            triggered_at = time.time()
            run_id = start(
                runtime,
                runtime.target(TARGET),
                cutoff,
                dry_run=dry_run,
                trigger="benchmark",
            ).run_id
            sampler = _Sampler(client, runtime.store, run_id, started, _port(self.endpoint))
            sampler.start()
            try:
                fields = _wait(runtime.store, run_id)
                seconds = (epoch_of(fields.get("ended_at")) or time.time()) - triggered_at
            finally:
                sampler.stop()
            cpu = {k: v - cpu_before.get(k, 0.0) for k, v in _cpu(pids, workers).items()}
            memory = [_tree_memory(w.pid) for w in workers]
            peak = memory_kib(sweep_child)[1] if sweep_child else None
            timings = runtime.store.runs.timings(TARGET)
            runtime.close()
        client.close()
        if complete and fields.get("status") != "complete":
            raise RuntimeError(f"run {run_id} ended {fields.get('status')}: {fields}")
        guard, swept, starved, depth = sampler.summary(slots)
        return RunResult(
            layout=layout,
            keys=keys,
            seconds=seconds,
            run=fields,
            guard_seconds=guard if not dry_run else seconds,
            sweep_seconds=swept if not dry_run else seconds,
            starved_share=starved,
            max_queue_depth=depth,
            memory=memory,
            sweep_baseline_kib=baseline,
            sweep_peak_kib=peak,
            cpu=cpu,
            timings=timings,
            message_bytes=sampler.message_bytes,
            message_body_bytes=sampler.body_bytes,
            s3_connections=len(sampler.connections),
            pools=[f"{pool} {size}" for pool, size in banners],
            worker_cores=cores,
        )

    def _worker(self, stack: Stack, spec: WorkerSpec, index: int) -> Process:
        argv = [_celery(), "-A", "digest_cleanup", *spec.argv(f"bench{index}")]
        # Celery lets the app's configured pool (threads) win over --pool=prefork; the
        # setting makes an asked-for pool hold.
        env = {"CLEANUP_WORKER_POOL": spec.pool} if spec.pool else {}
        return stack.start("worker", argv, env).wait_ready()


class _Sampler(threading.Thread):
    """Reads the run hash and the batch queue, often while the sweep publishes, then rarely."""

    def __init__(
        self, client: redis.Redis, store: RunStore, run_id: str, started: float, s3_port: int
    ) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.client = client
        self.s3_port = s3_port
        self.connections: set[int] = set()
        self.key = store.run_key(run_id)
        self.started = started
        self.samples: list[tuple[float, int, int, int, bool]] = []
        self.message_bytes: int | None = None
        self.body_bytes: int | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(self.key, "batches", "batches_done", "sweep_done")
            pipe.llen(BATCH_QUEUE)
            if self.message_bytes is None:
                pipe.lindex(BATCH_QUEUE, -1)
            found = pipe.execute()
            batches, done, swept = found[0]
            now = time.perf_counter() - self.started
            self.samples.append(
                (now, int(batches or 0), int(done or 0), int(found[1]), swept == b"1")
            )
            if self.message_bytes is None and found[2]:
                self._measure(found[2])
            settled = swept == b"1"
            if settled or len(self.samples) % CONNECTION_EVERY == 1:
                self.connections |= client_ports(self.s3_port)
            self._halt.wait(SETTLED_SAMPLE_SECONDS if settled else SAMPLE_SECONDS)

    def _measure(self, raw: bytes) -> None:
        self.message_bytes = len(raw)
        with_body = json.loads(raw)
        self.body_bytes = len(base64.b64decode(with_body["body"]))

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def summary(self, slots: int) -> tuple[float, float, float, int]:
        """(guard end, sweep end, starved share, deepest queue) from the samples."""
        first = next((t for t, b, *_ in self.samples if b > 0), 0.0)
        swept = next((t for t, *_, s in self.samples if s), 0.0)
        publishing = [(b - d, q) for t, b, d, q, s in self.samples if first <= t and not s]
        starved = sum(1 for inflight, _ in publishing if inflight < slots)
        share = starved / len(publishing) if publishing else 0.0
        depth = max((q for *_, q, _ in self.samples), default=0)
        return first, swept, share, depth


def _wait(store: RunStore, run_id: str) -> dict[str, str]:
    """The run's fields once its status is final; one cheap HGET per poll until then."""
    key = store.run_key(run_id)
    final = {status.encode() for status in FINAL_STATUSES}
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        if store.redis.hget(key, "status") in final:
            return dict(store.runs.get(run_id).fields)
        time.sleep(WAIT_POLL_SECONDS)
    raise TimeoutError(f"run {run_id} did not finish within {RUN_TIMEOUT:.0f} s")


def _port(url: str) -> int:
    return urlsplit(url).port or 80


def _pool(worker: Process) -> tuple[str, int]:
    """(pool, concurrency) from a ready worker's banner, such as ("threads", 64)."""
    found = _BANNER_POOL.search(worker.output())
    if found is None:
        raise RuntimeError(f"no concurrency line in the banner of {worker.name} ({worker.log})")
    pool = found.group(2)
    return ("threads" if pool == "thread" else pool), int(found.group(1))


def _celery() -> str:
    """The ``celery`` script next to this interpreter (a virtualenv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "celery"
    return str(beside) if beside.exists() else "celery"


def _cpu(servers: dict[str, int], workers: Sequence[Process]) -> dict[str, float]:
    out = {name: cpu_seconds(pid) for name, pid in servers.items()}
    for i, worker in enumerate(workers):
        out[f"worker {i + 1}"] = cpu_seconds(worker.pid) + sum(
            cpu_seconds(c) for c in children(worker.pid)
        )
    return out


def _tree_memory(pid: int) -> dict[str, tuple[int, int]]:
    out = {"main": memory_kib(pid)}
    for i, child in enumerate(children(pid)):
        out[f"child {i + 1}"] = memory_kib(child)
    return out


def _median_p95(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
