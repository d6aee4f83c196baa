"""The benchmark's results: the console tables and BENCHMARKS.md.

Every time in the local table is also given as a ratio to a baseline measured in
the same round (``0.90x`` means the method took 90% of the baseline's time),
because the machine may be shared and absolute seconds drift from one run to the
next.  There are two baselines, one per kind of delete: the faster conditional
probe of the round (it sends what the pipeline sends by default, each key with
its listed ETag), and the faster of the unconditional probe and s5cmd.  A
pipeline run is held to the one that does the same work as it.  The table
against the model of AWS S3 gives its times as ratios to that table's floor
instead (see :mod:`benchmarks.aws_table`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.alternatives import Measured
from benchmarks.aws_table import (
    HEADING as MODEL_HEADING,
)
from benchmarks.aws_table import (
    TARGET_FLOOR_RATIO,
    TARGET_THROTTLED_SHARE,
    ModelRow,
    ModelTable,
)
from benchmarks.environment import Machine, Pinning
from benchmarks.pipeline import RunResult
from benchmarks.scaling import Scaling

#: The acceptance targets of the local table.  The shipped pipeline (conditional
#: deletes) within 5% of a bare probe sending the same conditional deletes: what is
#: left is the orchestration's cost, on a server that has its own core.
TARGET_RATIO = 1.05
TARGET_SPEEDUP = 5.0
TARGET_RSS_GROWTH = 1.2

#: How the benchmark is read, and what was tried on the way to the shipped layout.  It holds
#: no figure of the current run (those are computed above it in BENCHMARKS.md), so every
#: ``make bench`` writes it out verbatim.
METHOD = "\n\n".join(
    [
        "Each round (three by default, `--rounds`) deletes five fresh copies of the keys: the "
        "raw list-then-DeleteObjects probe twice at each of its thread counts (once sending "
        "each key with its listed ETag, as the pipeline does, once bare), `s5cmd rm`, and the "
        "pipeline under each layout (`default` and `default!unconditional`), the probes and "
        "s5cmd first in some rounds and last in the others, so neither side always goes "
        "first.  Each pipeline run is compared with the faster run of its own round that does "
        "the same work: a conditional run with the faster conditional probe, an unconditional "
        "one with the faster of the unconditional probe and s5cmd.  Each layout's figure is "
        "the median of those paired ratios: on these shared machines the S3 server's CPU per "
        "deleted key varied by up to 25% between identical runs, so one paired ratio could "
        "land 10% either side of another.  Seeding a fresh copy takes longer than deleting "
        "it several times over (the rate is in the first paragraph), which is what keeps a "
        "round at five copies and the default at three rounds.",
        "**The S3 server has a core of its own.** `weed` is pinned to one core, and "
        "everything else the benchmark starts or runs (this process and its probe threads, "
        "s5cmd, the AWS CLI, Redis, the Celery workers and their pool processes) to the "
        "others; the Machine section says which, as checked on the workers.  Unpinned, the "
        "server shares its cores with whatever it is measured against, so a method that "
        "spends more CPU on the client side (Celery, botocore, the run store's scripts) also "
        "slows the server down and is charged twice.  Pinned, every method meets a server of "
        "the same size, as it would a remote S3.  On a one-core machine nothing is pinned.",
        "**What safety costs.** The pipeline sends each key's ETag, so the server checks every "
        "key before deleting it, and asks for the verbose answer that confirms each delete.  "
        "The conditional probe sends the same requests, so the acceptance line compares like "
        "with like; the pipeline run again with `conditional_deletes = false`, against the "
        "unconditional probe and s5cmd, shows the rest.  Before deletes were conditional, the "
        "pipeline ran at parity with the bare server (1.00x to 1.15x the probe's time across "
        "runs, about 1.05x typically).  Against AWS S3 the check runs on AWS's side, which a "
        "local benchmark cannot measure.",
        "**Why the pipeline does not delete while listing.** That is the way past a "
        "list-then-delete script, and the pipeline does not take it, on purpose: the guard "
        "pass counts every expired key against `max_delete` before anything is deleted, so a "
        "misconfigured target (a wrong prefix, a wrong retention) deletes nothing rather than "
        "up to `max_delete` keys.  To keep that cheap, the guard lists a folder as four key "
        "ranges at once and stages the batches in Redis as it counts, so it never lists twice "
        "and publishes its first batch about when the probe, listing in one stream, starts "
        "deleting (the guard pass under What limits the pipeline now).",
        "**Worker layouts.** Deletes wait on S3, so give them threads.  The `default` layout "
        "is a plain `celery -A digest_cleanup worker`, which runs the pool the app configures "
        '(`worker_pool = "threads"`, `worker_concurrency = 64`; its row shows what the '
        "worker's banner said), with the targets file's default batch size.  Celery's own "
        "default (prefork, one process per core) keeps two deletes in flight on a 2-core "
        "host, and took 3.4x the probe's time when it was measured here.  Earlier runs gave "
        "the sweep a worker of its own and batches of 1000 keys "
        "(`sweeps:prefork:1+batches:threads:64@1000`, still measurable with `--layouts`); on "
        "the reference machine 8, 12, 16 and 32 threads and a gevent pool were slower than "
        "64, and 128 threads or two workers of 64 were no faster.  The probe was tuned the "
        "same way: 8 threads were 20% slower than 64, 16 were 5% slower, 32 to 64 were within "
        "noise, and 128, with every request of a 120k run in flight at once, was as fast as "
        "64 or up to 7% faster in five of six paired rounds, so 128 is its default "
        "(`--probe-threads` adds others).",
        "**Against AWS S3.** That concurrency suits a local server.  Against AWS S3, 64 "
        "requests of 1,000 keys in flight pass S3's 3,500 deletes/s per prefix and are "
        "throttled, and a retried `SlowDown` wastes the window.  The pipeline's shared "
        "`delete_rate` budget holds every worker of a fleet under one rate instead, and the "
        "table against the model of AWS S3 measures it next to boto3's own retry modes, "
        "s5cmd and the AWS CLI.  Workers build their S3 clients when they start, so the "
        "first batch of a run does not wait for botocore to load.",
    ]
)


@dataclasses.dataclass(frozen=True)
class Round:
    """The probe and s5cmd runs of one round, and the baselines they give its pipeline runs."""

    runs: tuple[Measured, ...]

    @property
    def conditional(self) -> Measured:
        """The faster conditional probe: the same requests as the pipeline's by default."""
        return min((m for m in self.runs if m.conditional), key=lambda m: m.seconds)

    @property
    def unconditional(self) -> Measured:
        """The faster of the unconditional probe and s5cmd."""
        return min((m for m in self.runs if not m.conditional), key=lambda m: m.seconds)

    def like(self, conditional: bool) -> Measured:
        return self.conditional if conditional else self.unconditional

    def twin(self, probe: Measured) -> Measured | None:
        """The unconditional probe run of this round at a conditional one's thread count."""
        method = probe.method.replace("conditional, ", "", 1)
        return next((m for m in self.runs if m.method == method and not m.conditional), None)


@dataclasses.dataclass(frozen=True)
class Paired:
    """A pipeline run and the probe and s5cmd runs of its round, on the same machine state."""

    run: RunResult
    baselines: Round

    @property
    def probe(self) -> Measured:
        """The baseline that does the same work: conditional deletes or not."""
        return self.baselines.like(self.run.layout.conditional)

    @property
    def ratio(self) -> float:
        return _ratio(self.run.seconds, self.probe.seconds)

    def ratio_to(self, conditional: bool) -> float:
        return _ratio(self.run.seconds, self.baselines.like(conditional).seconds)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the results table, scaled to the full key count."""

    method: str
    seconds: list[float]
    #: Time against the conditional baseline, and against the unconditional one.
    ratios: tuple[float, float]
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
    """Everything one ``make bench`` measured on the local server."""

    keys: int
    machine: Machine
    load: tuple[float, float]
    seed_rate: float
    pinning: Pinning
    #: The probe and s5cmd runs of each round.
    rounds: list[Round]
    #: The probe's thread counts, each run in every round, conditional and not.
    probe_threads: list[int]
    #: Per layout, its runs paired with their rounds' baselines.
    pipelines: list[list[Paired]]
    tuned: Measured
    aws: Measured
    naive: Measured
    scaling: Scaling | None
    #: The table against the model of AWS S3, when it was measured too.
    model: ModelTable | None = None
    started: datetime = dataclasses.field(default_factory=lambda: datetime.now(UTC))

    @property
    def probe_runs(self) -> list[Measured]:
        """Every probe and s5cmd run, round after round."""
        return [m for r in self.rounds for m in r.runs]

    def baseline_seconds(self, conditional: bool) -> float:
        """The median over rounds of one kind of baseline."""
        return statistics.median(r.like(conditional).seconds for r in self.rounds)

    def vs(self, seconds: float) -> tuple[float, float]:
        """``seconds`` against the median conditional and unconditional baselines."""
        return (
            _ratio(seconds, self.baseline_seconds(True)),
            _ratio(seconds, self.baseline_seconds(False)),
        )

    def layout_ratio(self, runs: list[Paired]) -> float:
        """The median of a layout's paired ratios to the baseline doing the same work."""
        return statistics.median(p.ratio for p in runs)

    @property
    def best(self) -> list[Paired]:
        """The fastest layout that deletes as shipped (conditionally), else the fastest."""
        shipped = [runs for runs in self.pipelines if runs[0].run.layout.conditional]
        return min(shipped or self.pipelines, key=self.layout_ratio)

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

    def s5cmd_share(self) -> tuple[int, int]:
        """(rounds whose unconditional baseline was s5cmd, rounds)."""
        won = sum(1 for r in self.rounds if r.unconditional.method.startswith("s5cmd"))
        return won, len(self.rounds)

    def rows(self) -> list[Row]:
        rows = []
        for runs in self.pipelines:
            mark = " **(best)**" if runs is self.best and len(self.pipelines) > 1 else ""
            ratios = (
                statistics.median(p.ratio_to(True) for p in runs),
                statistics.median(p.ratio_to(False) for p in runs),
            )
            seconds = [p.run.seconds for p in runs]
            rows.append(Row(f"pipeline: {runs[0].run.label()}{mark}", seconds, ratios))
        for method in dict.fromkeys(m.method for m in self.probe_runs):
            measured = [m for m in self.probe_runs if m.method == method]
            seconds = [m.seconds for m in measured]
            kind = "conditional" if measured[0].conditional else "unconditional"
            won = sum(1 for m in measured if any(m is r.like(m.conditional) for r in self.rounds))
            note = f"the {kind} baseline in {won} of {len(measured)} rounds"
            if "list" in measured[0].phases:
                note = (
                    f"median list {statistics.median(m.phases['list'] for m in measured):.1f} s, "
                    f"delete {statistics.median(m.phases['delete'] for m in measured):.1f} s; "
                ) + note
            rows.append(Row(method, seconds, self.vs(statistics.median(seconds)), note))
        tuned = self.tuned
        rows.append(
            Row(
                tuned.method,
                [tuned.seconds],
                self.vs(tuned.seconds),
                "list {list:.1f} s, delete {delete:.1f} s".format(**tuned.phases),
            )
        )
        for other in (self.aws, self.naive):
            note = ""
            if other.keys != self.keys:
                note = f"measured on {other.keys:,} keys, extrapolated"
            scaled = other.scaled_to(self.keys)
            rows.append(Row(other.method, [scaled], self.vs(scaled), note))
        return rows


def _ratio(seconds: float, baseline: float) -> float:
    return seconds / baseline if baseline else 0.0


def _median_run(runs: list[Paired]) -> RunResult:
    ordered = sorted(runs, key=lambda p: p.run.seconds)
    return ordered[(len(ordered) - 1) // 2].run


def table(results: Results) -> str:
    """The local results table as Markdown (it reads fine in a terminal too)."""
    lines = [
        f"| method | runs | seconds for {results.keys:,} keys (median) | range | keys/s "
        "| vs conditional probe | vs unconditional probe or s5cmd | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in results.rows():
        lines.append(
            f"| {row.method} | {len(row.seconds)} | {row.median:,.1f} | {row.spread()} "
            f"| {results.keys / row.median:,.0f} | {row.ratios[0]:.2f}x | {row.ratios[1]:.2f}x "
            f"| {row.note} |"
        )
    return "\n".join(lines)


def headline(results: Results) -> str:
    """The headline in one sentence; the README's table quotes its figures."""
    seconds = results.best_seconds
    where = "" if results.pinning.skipped else " on a core of its own"
    best = results.best
    kind = "conditional deletes, as shipped" if best[0].run.layout.conditional else "no conditions"
    twin = results.unconditional
    unconditional = (
        f"; with conditions off, {results.layout_ratio(twin):.2f}x the time of the faster of "
        "the unconditional probe and s5cmd"
        if twin
        else ""
    )
    return (
        f"On a {results.machine.cores}-core machine against a local SeaweedFS{where}, the "
        f"pipeline deleted {results.keys:,} expired digests end to end in {seconds:.1f} s "
        f"({results.keys / seconds:,.0f} keys/s, median of {len(best)} runs, {kind}): "
        f"{results.layout_ratio(best):.2f}x the time of the faster raw list-then-DeleteObjects "
        f"probe of the same round sending the same requests{unconditional}; "
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
    # Every layout runs in every round, so the two lists line up round by round.
    time_ratio = statistics.median(
        _ratio(a.run.seconds, b.run.seconds) for a, b in zip(results.best, twin, strict=False)
    )
    probe_ratios = [
        _ratio(r.conditional.seconds, bare.seconds)
        for r in results.rounds
        if (bare := r.twin(r.conditional)) is not None
    ]
    probe_ratio = statistics.median(probe_ratios) if probe_ratios else 0.0
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
        "The time ratio is the median, over rounds, of the conditional run's time over the "
        "unconditional run's of the same round; for the raw probe at the same thread count "
        f"the same ratio was {probe_ratio:.2f}x, the server's side of the cost alone.  The "
        "extra bytes are the quoted ETags (34 characters a key, base64-encoded in the "
        "message).  Where the time goes shows in the CPU rows: the server checks each key's "
        "ETag before it deletes it"
        + (
            f", on {_server_cores(results)}, so its extra CPU shows as extra time"
            if not results.pinning.skipped
            else ", sharing the machine with everything else"
        )
        + ".  Against AWS S3 that check runs on AWS's side, not measured here.",
    ]
    return "\n".join(lines)


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("s" if count != 1 else "")


def _server_cores(results: Results) -> str:
    count = len(results.pinning.server)
    return "a core of its own" if count == 1 else f"{count} cores of its own"


def _batch(result: RunResult) -> float:
    keys = [n for *_, n in result.timings]
    return sum(keys) / len(keys) if keys else 500.0


def _memory(result: RunResult) -> str:
    parts = []
    for i, worker in enumerate(result.memory, 1):
        spec = result.layout.workers[i - 1]
        observed = result.pools[i - 1] if len(result.pools) == len(result.memory) else ""
        procs = ", ".join(f"{name} {peak / 1024:.0f} MiB" for name, (_, peak) in worker.items())
        parts.append(f"worker {i} ({spec.label(observed)}): {procs}")
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
    """Each acceptance target of the local table, met or missed, with the numbers."""
    best = results.best
    ratio = results.layout_ratio(best)
    layout = best[0].run.layout
    name = "default layout" if layout.spec.partition("!")[0] == "default" else layout.spec
    kind = "conditional" if layout.conditional else "unconditional"
    baseline = "conditional probe" if layout.conditional else "unconditional probe and s5cmd"
    lines = [
        _check(
            ratio <= TARGET_RATIO,
            f"pipeline, {name} ({kind}) within {TARGET_RATIO:.2f}x of the faster of the "
            f"{baseline} of its round: {ratio:.2f}x",
        )
    ]
    twin = results.unconditional
    if twin is not None:
        won, rounds = results.s5cmd_share()
        lines.append(
            f"- reported: pipeline, {name} with conditions off, "
            f"{results.layout_ratio(twin):.2f}x the faster of the unconditional probe and "
            f"s5cmd of its round (s5cmd was the faster in {won} of {rounds} rounds)"
        )
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
                # 0 means no RSS was read (no pool process to read it from): not met.
                0 < rss <= TARGET_RSS_GROWTH,
                f"sweep peak RSS at {results.scaling.runs[-1].keys:,} keys within "
                f"{TARGET_RSS_GROWTH}x of its peak at {results.scaling.runs[0].keys:,}: {rss:.2f}x "
                f"(time grew {time_ratio:.1f}x for {keys:.0f}x the keys)",
            )
        )
    return lines


def _check(ok: bool, text: str) -> str:
    return f"- [{'x' if ok else ' '}] {'met' if ok else 'MISSED'}: {text}"


def model_table(model: ModelTable) -> str:
    """The table against the model of AWS S3 as Markdown."""
    lines = [
        f"| method | seconds for {model.keys:,} keys | vs floor | delete requests throttled "
        "| keys left | dead letters | note |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| floor: {model.keys:,} keys at {model.write_rate:,.0f} keys/s, after one listing "
        f"through the model ({model.listing.seconds:.1f} s) | {model.floor:.1f} | 1.00x "
        "| | | | |",
    ]
    for row in model.rows:
        left = f"{row.left:,}" + (f" of {row.keys:,}" if row.keys != model.keys else "")
        dead = "n/a" if row.dead_letters is None else f"{row.dead_letters:,}"
        lines.append(
            f"| {row.method} | {row.scaled_to(model.keys):,.1f} | {model.ratio(row):.2f}x "
            f"| {row.throttled_share:.1%} | {left} | {dead} | {_model_note(row)} |"
        )
    return "\n".join(lines)


#: How each form of SlowDown reads in a note.
_FORMS = {"503": "by a 503", "200": "by a 200 error body", "per_key": "by per-key errors"}


def _model_note(row: ModelRow) -> str:
    parts = [row.note] if row.note else []
    forms = [f"{n:,} {_FORMS.get(form, form)}" for form, n in sorted(row.throttles.items()) if n]
    if forms:
        parts.append(f"throttled: {', '.join(forms)}")
    if row.peak_keys:
        parts.append(f"peak {row.peak_keys:,} keys accepted in one second")
    if row.list_requests:
        parts.append(_plural(row.list_requests, "list request"))
    return "; ".join(parts)


def model_acceptance(model: ModelTable) -> list[str]:
    """The acceptance targets of the pipeline against the model, met or missed."""
    row = model.pipeline_row
    ratio = model.ratio(row)
    return [
        _check(
            ratio <= TARGET_FLOOR_RATIO,
            f"pipeline at most {TARGET_FLOOR_RATIO:.2f}x the floor: {ratio:.2f}x "
            f"({row.seconds:.1f} s against {model.floor:.1f} s)",
        ),
        _check(
            row.throttled_share < TARGET_THROTTLED_SHARE,
            f"pipeline: under {TARGET_THROTTLED_SHARE:.0%} of its delete requests throttled: "
            f"{row.throttled_share:.1%}",
        ),
        _check(row.left == 0, f"pipeline: no key left: {row.left:,}"),
        _check(row.dead_letters == 0, f"pipeline: no dead letter: {row.dead_letters or 0:,}"),
    ]


def model_headline(model: ModelTable) -> str:
    row = model.pipeline_row
    return (
        f"Against a model of AWS S3's {model.write_rate:,.0f} keys/s write budget per prefix, "
        f"the pipeline deleted {model.keys:,} keys in {row.seconds:.1f} s, "
        f"{model.ratio(row):.2f}x the floor ({model.floor:.1f} s), with "
        f"{row.throttled_share:.1%} of its delete requests throttled, {row.left:,} keys left "
        f"and {row.dead_letters or 0:,} dead letters."
    )


def model_section(model: ModelTable, command: Sequence[str]) -> str:
    """The section on the model of AWS S3, whole: ``--no-local`` writes it alone."""
    budget = f"`delete_rate = {model.delete_rate:g}` in its targets file (`AWS_DELETE_RATE`)"
    return "\n".join(
        [
            MODEL_HEADING,
            "",
            f"Written by `{' '.join(command)}` on {model.started:%Y-%m-%d %H:%M} UTC.  Each "
            f"method deletes its own fresh copy of {model.keys:,} keys, seeded straight into "
            "the local `weed`, through its own fresh `AwsModel` "
            "(`tests/rig/aws_model.py`): a proxy that allows "
            f"{model.write_rate:,.0f} keys/s of deletes per prefix (every key of a "
            "DeleteObjects counts, bursts of one second), answers `SlowDown` past that in "
            "AWS's three forms (a 503, a 200 whose body is the error, per-key errors inside "
            "a DeleteResult) and adds request latency.  The floor is the keys at that rate "
            "after one listing of them through the model, measured in the same run; keys "
            "left are counted on `weed` itself after each run.",
            "",
            model_headline(model),
            "",
            model_table(model),
            "",
            *model_acceptance(model),
            "",
            f"The pipeline ran one plain worker with {budget}.  The stock-boto3 rows list "
            "with the pipeline's lean client and send the raw probe's 1000-key DeleteObjects "
            "from a stock client with boto3's retry mode: boto3 retries a throttled request "
            "within its attempts and never retries per-key errors, which stay as keys left.  "
            "s5cmd reports per-key errors without retrying them; a tool whose note says "
            "`exit 0` next to keys left did not report them.  `aws s3 rm` sends one "
            "DeleteObject per key and ran on a subset, extrapolated linearly; its keys left "
            "are of that subset."
            + (
                "  A row that left keys was done sooner by not deleting them: its time and "
                "its ratio to the floor are for less work, not faster work."
                if any(row.left for row in model.rows)
                else ""
            ),
            "",
            "### The pipeline's run through the model",
            "",
            details(model.pipeline),
            "",
        ]
    )


def replace_section(path: Path, heading: str, text: str) -> None:
    """Put ``text`` in ``path`` in place of the section under ``heading``, or at the end."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    path.write_text(new, encoding="utf-8")


def limits(results: Results) -> str:
    """What bounds the pipeline, read off this run's CPU accounting."""
    best = results.best_run
    conditional = best.layout.conditional
    baselines = [r.like(conditional) for r in results.rounds]
    weed = best.cpu.get("weed", 0.0)
    workers = sum(v for k, v in best.cpu.items() if k.startswith("worker"))
    redis_cpu = best.cpu.get("redis", 0.0)
    probe_weed = statistics.median(p.cpu.get("weed", 0.0) for p in baselines)
    probe_client = statistics.median(p.cpu.get("client", 0.0) for p in baselines)
    probe_list = statistics.median(p.phases.get("list", 0.0) for p in baselines)
    probe_delete = statistics.median(p.phases.get("delete", 0.0) for p in baselines)
    pipeline_cpu = weed + workers + redis_cpu
    probe_cpu = probe_weed + probe_client
    delete_phase = best.seconds - best.guard_seconds
    if results.pinning.skipped:
        server = f"of {results.machine.cores} cores"
        where = "on a machine where the server runs too"
        shared = "on a server that shared the machine with Celery, Redis and the run store"
    else:
        clients = len(results.pinning.clients)
        server = f"of its {_plural(len(results.pinning.server), 'pinned core')}"
        where = f"on the other {_plural(clients, 'core')}, not the server's"
        shared = f"on a server with {_server_cores(results)}"
    return "\n".join(
        [
            f"- **The S3 server's CPU.** `weed` spent {weed:.1f} CPU seconds in the best run "
            f"({weed / best.seconds:.2f} {server} on average) and {probe_weed:.1f} in a run of "
            f"the baseline it is held to: deleting {results.keys:,} keys costs the server about "
            f"{probe_weed / results.keys * 1e6:.0f} µs of CPU each, whoever asks.  The "
            f"pipeline's own processes added {workers:.1f} s (workers: the sweep, Celery, "
            f"botocore, the run store's scripts) and Redis {redis_cpu:.1f} s, against "
            f"{probe_client:.1f} s for the probe's one process: {pipeline_cpu:.1f} CPU seconds "
            f"in all against {probe_cpu:.1f}, {where}.  Against a remote S3 that overhead does "
            "not compete with the server either, and more workers on more hosts add delete "
            "capacity.",
            f"- **The guard pass.** Nothing is deleted until every expired key has been "
            f"counted against max_delete: {best.guard_seconds:.1f} s from the trigger to the "
            f"first batch ({best.guard_seconds / best.seconds:.0%} of the run), against the "
            f"probe's {probe_list:.1f} s of listing before its first delete.  The guard lists "
            "a folder as key ranges several at a time and stages the expired keys in Redis as "
            "batches, so publishing does not list again: the sweep was done publishing after "
            f"{best.sweep_seconds:.1f} s, with delete slots waiting for it in "
            f"{best.starved_share:.0%} of the samples taken meanwhile.  The pipeline then "
            f"deleted for {delete_phase:.1f} s against the probe's {probe_delete:.1f} s, "
            f"{shared}.",
            f"- **Celery overhead** is small next to the DeleteObjects call: median "
            f"{best.overhead()[0] * 1000:.1f} ms per batch against "
            f"{best.delete_call()[0] * 1000:.0f} ms for the call; the call is long because "
            "many run at once on a busy server.",
        ]
    )


def machine_section(results: Results) -> str:
    m = results.machine
    packages = ", ".join(f"{k} {v}" for k, v in m.packages.items())
    pinning = results.pinning
    line = f"- CPU pinning: {pinning.describe()}"
    if not pinning.skipped:
        seen = frozenset().union(*(p.run.worker_cores for runs in results.pipelines for p in runs))
        if seen and seen <= pinning.clients:
            line += (
                f"; checked: every Celery worker and pool process ran on CPU "
                f"{','.join(str(c) for c in sorted(seen))}"
            )
        elif seen:
            line += (
                f"; but the Celery workers were allowed CPU "
                f"{','.join(str(c) for c in sorted(seen))}"
            )
    return "\n".join(
        [
            f"- {m.cores} cores ({m.cpu}), {m.memory_gib:.1f} GiB memory, Linux {m.kernel}",
            f"- Python {m.python}; {m.weed.strip()} (`weed mini`); {m.redis.strip()}",
            f"- {packages}",
            line,
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
        "to baselines measured in the same round, since absolute seconds depend on the "
        "machine and on what else runs on it.  A second table runs the same job against a "
        "model of AWS S3's request-rate limits.",
        "",
        headline(results),
        *(["", model_headline(results.model)] if results.model else []),
        "",
        f"## Results: {results.keys:,} keys",
        "",
        table(results),
        "",
        "The pipeline's time runs from the trigger (the `start()` call `digest-cleanup run` "
        "makes, with the workers already up) to the run's status reading `complete`; it "
        "includes the guard pass, publishing, every batch and the run's final accounting.  "
        "A pipeline row's ratios are medians of its runs' ratios to their own rounds' "
        "baselines; the other rows' are of median times.",
        "",
        "## Acceptance",
        "",
        *acceptance(results),
        "",
    ]
    if results.model:
        parts += [model_section(results.model, command), ""]
    parts += [
        "## Inside the pipeline runs",
        "",
        "For each layout, its run with the median time.  A pipeline run's ratio is its time "
        "over the time of the faster run of its round doing the same work (probes at "
        f"{' and '.join(str(n) for n in results.probe_threads)} threads; s5cmd too for an "
        "unconditional run); the table shows the median of those ratios.",
        "",
    ]
    for runs in results.pipelines:
        run = _median_run(runs)
        ratios = ", ".join(f"{p.ratio:.2f}x" for p in runs)
        parts += [f"### {run.label()}", "", f"- Paired ratios: {ratios}.", details(run), ""]
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
        "make bench BENCH_ARGS=--help    # options: key counts, layouts, --no-local, ...",
        "```",
        "",
        "Everything runs on loopback ports picked at random: a `weed mini` and a Redis "
        "started for the benchmark, `celery -A digest_cleanup worker` processes, and one "
        "`AwsModel` proxy per row of the second table.  `BENCH_ARGS=--no-local` runs the "
        "second table alone and replaces only its section here; `--no-aws-model` leaves it "
        "out.  The "
        "first run also seeds the scaling data (1.32M keys, several minutes) into "
        "`$XDG_CACHE_HOME/digest-cleanup-bench` (default `~/.cache/digest-cleanup-bench`); "
        "later runs reuse it, and `BENCH_ARGS=--reseed` rebuilds it.",
        "",
    ]
    return "\n".join(parts)
