"""The benchmark's results: the console table and BENCHMARKS.md.

Every time is also given as a ratio to the raw probe's time in the same run
(``0.90x`` means the method took 90% of the probe's time), because the machine
may be shared and absolute seconds drift from one run to the next.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime

from benchmarks.alternatives import Measured
from benchmarks.environment import Machine
from benchmarks.pipeline import RunResult
from benchmarks.scaling import Scaling

#: The acceptance targets of the benchmark.
TARGET_RATIO = 1.0
STRETCH_RATIO = 0.75
TARGET_SPEEDUP = 5.0
TARGET_RSS_GROWTH = 1.2

#: How the benchmark is read, and what was tried on the way to the shipped layout.  It holds
#: no figure of the current run (those are computed above it in BENCHMARKS.md), so every
#: ``make bench`` writes it out verbatim.
METHOD = "\n\n".join(
    [
        "Each round (five by default, `--rounds`) runs the raw list-then-DeleteObjects probe at "
        "each of its thread counts and the pipeline under each layout (Celery's defaults in the "
        "first round only), the probes first in some rounds and last in the others, so neither "
        "side always goes first.  Each pipeline run is compared with the faster probe of its "
        "own round, on the same machine state, and each layout's figure is the median of "
        "those paired ratios: on these shared machines the S3 server's CPU per deleted key "
        "varied by up to 25% between identical runs, so one paired ratio could land 10% either "
        "side of another.",
        "**What safety costs.** The probes send unconditional deletes.  The pipeline sends each "
        "key's ETag, so the server checks every key before deleting it, and confirms each "
        "delete in a verbose answer; the layout run again with `conditional_deletes = false` "
        "measures the difference.  Before deletes were conditional, the pipeline ran at parity "
        "with the bare server (1.00x to 1.15x the probe's time across runs, about 1.05x "
        "typically).  Against AWS S3 the check runs on AWS's side, which a local benchmark "
        "cannot measure.",
        "**Why the pipeline does not delete while listing.** That is the way past a "
        "list-then-delete script, and the pipeline does not take it, on purpose: the guard "
        "pass counts every expired key against `max_delete` before anything is deleted, so a "
        "misconfigured target (a wrong prefix, a wrong retention) deletes nothing rather than "
        "up to `max_delete` keys.  To keep that cheap, the guard lists a folder as four key "
        "ranges at once and stages the batches in Redis as it counts, so it never lists twice "
        "and publishes its first batch about when the probe, listing in one stream, starts "
        "deleting (the guard pass under What limits the pipeline now).",
        "**Worker layouts.** Deletes wait on S3, so give them threads.  Celery's default "
        "(prefork, one process per core) keeps two deletes in flight on a 2-core host.  The "
        "fastest layout was one worker for `sweeps` and a threads-pool worker for `batches`, "
        "with `batch_size = 1000` in the target:",
        "```sh\n"
        "celery -A digest_cleanup worker -Q sweeps --pool=prefork --concurrency=1 -n sweeps@%h\n"
        "celery -A digest_cleanup worker -Q batches --pool=threads --concurrency=64 -n batches@%h\n"
        "```",
        "The sweep has a worker of its own because it is CPU-bound while deletes wait on S3, "
        "and a sweep in the delete pool would hold a delete slot for its whole length.  "
        "Threads cost less CPU than processes on a machine whose cores the S3 server needs, "
        "and batches of 1000 keys (the most DeleteObjects takes) halve the requests and "
        "messages.  On the reference machine 8, 12, 16 and 32 threads and a gevent pool were "
        "slower, and 128 threads or two workers of 64 were no faster.  The probe's baseline "
        "was tuned the same way: 8 threads were 20% slower than 64, 16 were 5% slower, 32 to "
        "64 were within noise, and 128, with every request of a 120k run in flight at once, "
        "was as fast as 64 or up to 7% faster in five of six paired rounds, so it is the "
        "stronger baseline.",
        "**Against AWS S3.** That concurrency suits a local server.  Against AWS S3, 64 "
        "requests of 1,000 keys in flight can pass S3's 3,500 deletes/s per prefix and be "
        "throttled (`SlowDown` is retried with backoff, but it wastes the window): size the "
        "pool with `digest-cleanup plan`, which warns past that rate.  Workers build their S3 "
        "clients when they start, so the first batch of a run does not wait for botocore to "
        "load.",
    ]
)


@dataclasses.dataclass(frozen=True)
class Paired:
    """A pipeline run and the faster probe run of its round, on the same machine state."""

    run: RunResult
    probe: Measured

    @property
    def ratio(self) -> float:
        return self.run.seconds / self.probe.seconds if self.probe.seconds else 0.0


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the results table, scaled to the full key count."""

    method: str
    seconds: list[float]
    ratio: float
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def spread(self) -> str:
        if len(self.seconds) < 2:
            return ""
        return f"{min(self.seconds):.1f}-{max(self.seconds):.1f}"


@dataclasses.dataclass
class Results:
    """Everything one ``make bench`` measured."""

    keys: int
    machine: Machine
    load: tuple[float, float]
    seed_rate: float
    #: The baseline of each round: the faster of its probe runs.
    probes: list[Measured]
    #: Every probe run, at every thread count.
    probe_runs: list[Measured]
    #: The probe's thread counts, each run in every round.
    probe_threads: list[int]
    #: Per layout, its runs paired with their probes; Celery's defaults first.
    pipelines: list[list[Paired]]
    tuned: Measured
    aws: Measured
    naive: Measured
    scaling: Scaling | None
    started: datetime = dataclasses.field(default_factory=lambda: datetime.now(UTC))

    @property
    def probe_seconds(self) -> float:
        return statistics.median(p.seconds for p in self.probes)

    def layout_ratio(self, runs: list[Paired]) -> float:
        """The median of a layout's paired ratios to the probe."""
        return statistics.median(p.ratio for p in runs)

    @property
    def default(self) -> list[Paired]:
        return self.pipelines[0]

    @property
    def best(self) -> list[Paired]:
        """The fastest layout that deletes as shipped: conditionally."""
        shipped = [runs for runs in self.pipelines if runs[0].run.layout.conditional]
        return min(shipped, key=self.layout_ratio)

    @property
    def unconditional(self) -> list[Paired] | None:
        """The best layout's twin with conditional deletes off, when one was measured."""
        spec = self.best[0].run.layout.spec
        return next(
            (r for r in self.pipelines if r[0].run.layout.spec == f"{spec}!unconditional"), None
        )

    @property
    def best_seconds(self) -> float:
        return statistics.median(p.run.seconds for p in self.best)

    @property
    def best_run(self) -> RunResult:
        """The best layout's run with the median time."""
        return _median_run(self.best)

    def rows(self) -> list[Row]:
        rows = []
        for runs in self.pipelines:
            mark = " **(best)**" if runs is self.best and len(self.pipelines) > 1 else ""
            label = runs[0].run.layout.label()
            seconds = [p.run.seconds for p in runs]
            rows.append(Row(f"pipeline: {label}{mark}", seconds, self.layout_ratio(runs)))
        for method in dict.fromkeys(p.method for p in self.probe_runs):
            runs = [p for p in self.probe_runs if p.method == method]
            seconds = [p.seconds for p in runs]
            baseline = sum(1 for p in runs if any(p is b for b in self.probes))
            rows.append(
                Row(
                    method,
                    seconds,
                    statistics.median(seconds) / self.probe_seconds,
                    f"median list {statistics.median(p.phases.get('list', 0.0) for p in runs):.1f}"
                    f" s, delete {statistics.median(p.phases.get('delete', 0.0) for p in runs):.1f}"
                    f" s; the faster probe in {baseline} of {len(runs)} rounds",
                )
            )
        tuned = self.tuned
        rows.append(
            Row(
                tuned.method,
                [tuned.seconds],
                tuned.seconds / self.probe_seconds,
                "list {list:.1f} s, delete {delete:.1f} s".format(**tuned.phases),
            )
        )
        for other in (self.aws, self.naive):
            note = ""
            if other.keys != self.keys:
                note = f"measured on {other.keys:,} keys, extrapolated"
            scaled = other.scaled_to(self.keys)
            rows.append(Row(other.method, [scaled], scaled / self.probe_seconds, note))
        return rows


def _median_run(runs: list[Paired]) -> RunResult:
    ordered = sorted(runs, key=lambda p: p.run.seconds)
    return ordered[(len(ordered) - 1) // 2].run


def table(results: Results) -> str:
    """The results table as Markdown (it reads fine in a terminal too)."""
    lines = [
        f"| method | runs | seconds for {results.keys:,} keys (median) | range | keys/s "
        "| time vs raw probe | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in results.rows():
        lines.append(
            f"| {row.method} | {len(row.seconds)} | {row.median:,.1f} | {row.spread()} "
            f"| {results.keys / row.median:,.0f} | {row.ratio:.2f}x | {row.note} |"
        )
    return "\n".join(lines)


def headline(results: Results) -> str:
    """The headline in one sentence; the README's table quotes its figures."""
    seconds = results.best_seconds
    return (
        f"On a {results.machine.cores}-core machine against a local SeaweedFS, the pipeline "
        f"deleted {results.keys:,} expired digests end to end in {seconds:.1f} s "
        f"({results.keys / seconds:,.0f} keys/s, median of {len(results.best)} runs): "
        f"{results.layout_ratio(results.best):.2f}x the time of the faster raw "
        "list-then-DeleteObjects probe of the same round; "
        f"{_speedup(results.tuned, results):.1f}x faster than a tuned list-then-delete "
        f"script with stock boto3, {_speedup(results.aws, results):.0f}x faster than "
        f"`aws s3 rm --recursive` and {_speedup(results.naive, results):.0f}x faster than "
        "a one-DeleteObject-per-key loop."
    )


def _speedup(other: Measured, results: Results) -> float:
    seconds = results.best_seconds
    return other.scaled_to(results.keys) / seconds if seconds else 0.0


def details(result: RunResult) -> str:
    """What happened inside one pipeline run."""
    overhead = result.overhead()
    call = result.delete_call()
    per_key = (
        f"{result.message_bytes:,} bytes in Redis ({result.message_body_bytes:,} of them the "
        f"task body, {result.message_bytes / _batch(result):.1f} bytes per key)"
        if result.message_bytes and result.message_body_bytes
        else "not sampled"
    )
    cpu = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result.cpu.items())
    lines = [
        f"- Guard pass (trigger to first batch published): {result.guard_seconds:.1f} s "
        f"({result.guard_seconds / result.seconds:.0%} of the run).",
        f"- Sweep done (every batch published): {result.sweep_seconds:.1f} s; the queue "
        f"held up to {result.max_queue_depth} batches; delete slots waited for the sweep in "
        f"{result.starved_share:.0%} of the samples taken while it was publishing.",
        f"- Celery overhead per batch (attempt wall time minus the DeleteObjects call): "
        f"median {overhead[0] * 1000:.1f} ms, p95 {overhead[1] * 1000:.1f} ms over "
        f"{len(result.timings)} attempts; the DeleteObjects call itself: median "
        f"{call[0] * 1000:.0f} ms, p95 {call[1] * 1000:.0f} ms.",
        f"- One batch message: {per_key}.",
        f"- Connections to S3 opened during the run: {result.s3_connections}, for "
        f"{len(result.timings)} batches plus the sweep's listing pages (one client per "
        "process; connections are kept and reused).",
        f"- CPU seconds during the run: {cpu} (wall {result.seconds:.1f} s).",
        f"- Peak RSS per worker process: {_memory(result)}.",
    ]
    return "\n".join(lines)


def condition_cost(results: Results) -> str:
    """What conditional deletes cost, from the best layout and its unconditional twin."""
    twin = results.unconditional
    if twin is None:
        return "Not measured in this run: no `!unconditional` twin of the best layout."
    with_, without = _median_run(results.best), _median_run(twin)
    time_ratio = results.layout_ratio(results.best) / results.layout_ratio(twin)
    lines = [
        "Each key's delete carries the ETag its listing saw, so S3 deletes it only if it is "
        "unchanged (see the README's deletion-safety contract).  The best layout was run "
        "again with `conditional_deletes = false`, in the same rounds:",
        "",
        "| | conditional (shipped) | unconditional | cost |",
        "|---|---:|---:|---:|",
        f"| seconds for {results.keys:,} keys (median) | {results.best_seconds:.1f} | "
        f"{statistics.median(p.run.seconds for p in twin):.1f} | {time_ratio:.2f}x the time |",
    ]
    if with_.message_bytes and without.message_bytes:
        lines.append(
            f"| one batch message in Redis | {with_.message_bytes:,} bytes "
            f"({with_.message_bytes / _batch(with_):.1f} per key) | {without.message_bytes:,} "
            f"bytes ({without.message_bytes / _batch(without):.1f} per key) | "
            f"{with_.message_bytes / without.message_bytes:.2f}x the bytes |"
        )
    server = (with_.cpu.get("weed", 0.0), without.cpu.get("weed", 0.0))
    workers = tuple(
        sum(v for k, v in run.cpu.items() if k.startswith("worker")) for run in (with_, without)
    )
    lines += [
        f"| S3 server CPU seconds (median run) | {server[0]:.1f} | {server[1]:.1f} | "
        f"{server[0] - server[1]:+.1f} s |",
        f"| pipeline workers' CPU seconds (median run) | {workers[0]:.1f} | {workers[1]:.1f} | "
        f"{workers[0] - workers[1]:+.1f} s |",
        "",
        "The time ratio is of the two layouts' median paired ratios to their rounds' probes. "
        "The extra bytes are the quoted ETags (34 characters a key, base64-encoded in the "
        "message). Where the time goes shows in the CPU rows: the server checks each key's "
        "ETag before it deletes it, and here it shares two cores with everything else, so "
        "its extra CPU is most of the extra time. Against AWS S3 that check runs on AWS's "
        "side, not measured here.",
    ]
    return "\n".join(lines)


def _batch(result: RunResult) -> float:
    keys = [n for *_, n in result.timings]
    return sum(keys) / len(keys) if keys else 500.0


def _memory(result: RunResult) -> str:
    parts = []
    for i, worker in enumerate(result.memory, 1):
        spec = result.layout.workers[i - 1]
        procs = ", ".join(f"{name} {peak / 1024:.0f} MiB" for name, (_, peak) in worker.items())
        parts.append(f"worker {i} ({spec.label()}): {procs}")
    return "; ".join(parts)


def scaling_table(scaling: Scaling) -> str:
    lines = [
        "| keys | dry-run seconds | keys/s | sweep process peak RSS | before the run | growth |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for run in scaling.runs:
        growth = run.peak_mib - run.baseline_mib
        lines.append(
            f"| {run.keys:,} | {run.result.seconds:.1f} | {run.keys / run.result.seconds:,.0f} "
            f"| {run.peak_mib:.0f} MiB | {run.baseline_mib:.0f} MiB | +{growth:.0f} MiB |"
        )
    return "\n".join(lines)


def scaling_ratios(scaling: Scaling) -> tuple[float, float, float]:
    """(keys ratio, time ratio, peak RSS ratio) of the largest dry run to the smallest."""
    small, large = scaling.runs[0], scaling.runs[-1]
    return (
        large.keys / small.keys,
        large.result.seconds / small.result.seconds,
        large.peak_mib / small.peak_mib if small.peak_mib else 0.0,
    )


def acceptance(results: Results) -> list[str]:
    """Each acceptance target of the benchmark, met or missed, with the numbers."""
    ratio = results.layout_ratio(results.best)
    lines = [
        _check(
            ratio <= TARGET_RATIO,
            f"pipeline at most {TARGET_RATIO:.2f}x the raw probe's time: {ratio:.2f}x"
            + (f" (stretch {STRETCH_RATIO:.2f}x: {'met' if ratio <= STRETCH_RATIO else 'missed'})"),
        )
    ]
    for other in (results.aws, results.naive):
        speedup = _speedup(other, results)
        lines.append(
            _check(
                speedup >= TARGET_SPEEDUP,
                f"at least {TARGET_SPEEDUP:.0f}x faster than {other.method}: {speedup:.1f}x",
            )
        )
    if results.scaling and len(results.scaling.runs) > 1:
        keys, time_ratio, rss = scaling_ratios(results.scaling)
        lines.append(
            _check(
                rss <= TARGET_RSS_GROWTH,
                f"sweep peak RSS at {results.scaling.runs[-1].keys:,} keys within "
                f"{TARGET_RSS_GROWTH}x of its peak at {results.scaling.runs[0].keys:,}: {rss:.2f}x "
                f"(time grew {time_ratio:.1f}x for {keys:.0f}x the keys)",
            )
        )
    return lines


def _check(ok: bool, text: str) -> str:
    return f"- [{'x' if ok else ' '}] {'met' if ok else 'MISSED'}: {text}"


def limits(results: Results) -> str:
    """What bounds the pipeline, read off this run's CPU accounting."""
    best = results.best_run
    cores = results.machine.cores
    weed = best.cpu.get("weed", 0.0)
    workers = sum(v for k, v in best.cpu.items() if k.startswith("worker"))
    redis_cpu = best.cpu.get("redis", 0.0)
    probe_weed = statistics.median(p.cpu.get("weed", 0.0) for p in results.probes)
    probe_client = statistics.median(p.cpu.get("client", 0.0) for p in results.probes)
    probe_list = statistics.median(p.phases.get("list", 0.0) for p in results.probes)
    probe_delete = statistics.median(p.phases.get("delete", 0.0) for p in results.probes)
    pipeline_cpu = weed + workers + redis_cpu
    probe_cpu = probe_weed + probe_client
    delete_phase = best.seconds - best.guard_seconds
    return "\n".join(
        [
            f"- **The S3 server's CPU, shared with the pipeline.** `weed` spent {weed:.1f} CPU "
            f"seconds in the best run ({weed / best.seconds:.2f} of {cores} cores on average) "
            f"and {probe_weed:.1f} in a probe run: deleting {results.keys:,} keys costs the "
            f"server about {probe_weed / results.keys * 1e6:.0f} µs of CPU each, whoever asks. "
            f"The pipeline's own processes added {workers:.1f} s (workers: the sweep, Celery, "
            f"botocore, the run store's scripts) and Redis {redis_cpu:.1f} s, against "
            f"{probe_client:.1f} s for the probe's one process: {pipeline_cpu:.1f} CPU seconds "
            f"in all against {probe_cpu:.1f}, on a machine where the server runs too.  Against "
            "a remote S3 that overhead no longer competes with the server, and more workers "
            "on more hosts add delete capacity; here they would only take CPU from `weed`.",
            f"- **The guard pass.** Nothing is deleted until every expired key has been "
            f"counted against max_delete: {best.guard_seconds:.1f} s from the trigger to the "
            f"first batch ({best.guard_seconds / best.seconds:.0%} of the run), against the "
            f"probe's {probe_list:.1f} s of listing before its first delete.  The guard lists "
            "a folder as key ranges several at a time and stages the expired keys in Redis as "
            "batches, so publishing does not list again: the sweep was done publishing after "
            f"{best.sweep_seconds:.1f} s, with delete slots waiting for it in "
            f"{best.starved_share:.0%} of the samples taken meanwhile.  The pipeline then "
            f"deleted for {delete_phase:.1f} s against the probe's {probe_delete:.1f} s, on a "
            "server that shared its two cores with Celery, Redis and the run store.",
            f"- **Celery overhead** is small next to the DeleteObjects call: median "
            f"{best.overhead()[0] * 1000:.1f} ms per batch against "
            f"{best.delete_call()[0] * 1000:.0f} ms for the call; the call is long because "
            "many run at once on a busy server.",
        ]
    )


def machine_section(results: Results) -> str:
    m = results.machine
    packages = ", ".join(f"{k} {v}" for k, v in m.packages.items())
    return "\n".join(
        [
            f"- {m.cores} cores ({m.cpu}), {m.memory_gib:.1f} GiB memory, Linux {m.kernel}",
            f"- Python {m.python}; {m.weed.strip()} (`weed mini`); {m.redis.strip()}",
            f"- {packages}",
            f"- load average at start {results.load[0]:.2f}, at end {results.load[1]:.2f} "
            "(above the core count means other work shared the machine)",
        ]
    )


def markdown(results: Results, command: Sequence[str]) -> str:
    """BENCHMARKS.md."""
    parts = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {results.started:%Y-%m-%d %H:%M} UTC. Every method "
        f"deletes its own fresh copy of the same {results.keys:,} keys in the digest layout "
        f"(`statements/WEEK/cust-NNNNNNN.pdf`), seeded at {results.seed_rate:,.0f} keys/s "
        "into a local `weed mini`, with a dedicated Redis; times are also given as ratios "
        "to the raw probe measured in the same invocation, since absolute seconds depend "
        "on the machine and on what else runs on it.",
        "",
        headline(results),
        "",
        f"## Results: {results.keys:,} keys",
        "",
        table(results),
        "",
        "The pipeline's time runs from the trigger (the `start()` call `digest-cleanup run` "
        "makes, with the workers already up) to the run's status reading `complete`; it "
        "includes the guard pass, publishing, every batch and the run's final accounting.",
        "",
        "## Acceptance",
        "",
        *acceptance(results),
        "",
        "## Inside the pipeline runs",
        "",
        "For each layout, its run with the median time.  A pipeline run's ratio is its time "
        "over the time of the faster probe of its round (same machine state, probes at "
        f"{' and '.join(str(n) for n in results.probe_threads)} threads); the table shows "
        "the median of those ratios.",
        "",
    ]
    for runs in results.pipelines:
        run = _median_run(runs)
        ratios = ", ".join(f"{p.ratio:.2f}x" for p in runs)
        parts += [f"### {run.layout.label()}", "", f"- Paired ratios: {ratios}.", details(run), ""]
    if results.scaling:
        keys, time_ratio, rss = scaling_ratios(results.scaling)
        parts += [
            "## Scaling: the guard pass over 120k and 1.2M keys",
            "",
            "A dry run (`digest-cleanup run TARGET --dry-run`) lists and counts every key "
            "and deletes nothing: it is the guard pass alone, run by a worker that consumes "
            "only the `sweeps` queue with one pool process, whose peak RSS (`VmHWM`) is "
            "shown.  The data is seeded once into a cached `weed` directory and reused.",
            "",
            scaling_table(results.scaling),
            "",
            f"{keys:.0f}x the keys took {time_ratio:.1f}x the time, and the sweep's peak RSS "
            f"changed by {rss:.2f}x: the sweep streams pages and holds no listing in memory.  "
            "Time grows at most linearly.  Both listings run four streams at once "
            "(`digest_cleanup/kinds/s3_shards.py`): the 120k bucket's one weekly folder as "
            "four key ranges, the 1.2M bucket's ten weekly folders four at a time.",
            "",
        ]
    parts += ["## What conditional deletes cost", "", condition_cost(results), ""]
    parts += [
        "## What limits the pipeline now",
        "",
        limits(results),
        "",
        "## How it was measured, and what was tried",
        "",
        METHOD,
        "",
        "## Machine",
        "",
        machine_section(results),
        "",
        "## Reproduce",
        "",
        "```",
        "make install",
        "make bench                      # " + " ".join(command),
        "make bench BENCH_ARGS=--help    # options: key counts, layouts, cache, --no-scale",
        "```",
        "",
        "Everything runs on loopback ports picked at random: a `weed mini` and a Redis "
        "started for the benchmark, and `celery -A digest_cleanup worker` processes.  The "
        "first run also seeds the scaling data (1.32M keys, several minutes) into "
        "`$XDG_CACHE_HOME/digest-cleanup-bench` (default `~/.cache/digest-cleanup-bench`); "
        "later runs reuse it, and `BENCH_ARGS=--reseed` rebuilds it.",
        "",
    ]
    return "\n".join(parts)
