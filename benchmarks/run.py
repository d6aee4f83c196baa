"""``make bench``: the 120k weekly run end to end, against the alternatives, in one run.

It starts a ``weed mini`` and a Redis on free loopback ports and seeds a fresh
copy of the same keys for every measurement.  In each of ``--rounds`` rounds it
runs the raw probe at each of its thread counts and the pipeline under each
worker layout (Celery's defaults in the first round only), probes first in even
rounds and last in odd ones, so every pipeline run is paired with the faster
probe of its own round and neither side always goes first.  Then it runs a tuned
stock-boto3 script, ``aws s3 rm --recursive`` and a per-key loop (the last two
on subsets, extrapolated), and a dry run over 120k and 1.2M cached keys shows
how the sweep scales.  It prints the table and writes BENCHMARKS.md at the
repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import dead_letters, report, scaling
from benchmarks.alternatives import Measured, aws_rm, naive_loop, raw_probe, reference_script
from benchmarks.environment import Machine, cpu_seconds, load_average
from benchmarks.pipeline import PREFIX, Layout, Runner, RunResult
from digest_cleanup.testing.seed import create_bucket, digest_layout_keys, seed_keys
from digest_cleanup.testing.servers import RedisServer, WeedServer

#: The weekly run of the ~120k-customer digest.
DEFAULT_KEYS = 120_000
#: Worker layouts tried, Celery's defaults first (see :meth:`Layout.parse`).  The other
#: gives the sweep a worker of its own (it is CPU-bound while deletes wait on S3, and a
#: sweep in the delete pool holds a delete slot for its whole length) and keeps 64
#: deletes in flight, with threads, which cost less CPU than processes on a machine
#: whose cores the S3 server needs; batches of 1000 keys (the most DeleteObjects takes)
#: halve the requests and messages.  On the reference machine 8, 12, 16 and 32 threads
#: and a gevent pool were slower, and 128 threads or two workers of 64 were no faster.
#: The best layout runs a second time with conditional deletes off, to show their cost.
DEFAULT_LAYOUTS = (
    "default",
    "sweeps:prefork:1+batches:threads:64@1000",
    "sweeps:prefork:1+batches:threads:64@1000!unconditional",
)
#: Rounds of (probes, layouts): the machine may be shared, so every pipeline run is
#: paired with the faster probe of its own round, and the median of the paired
#: ratios is reported.  On the reference machine the S3 server's CPU per deleted
#: key varied by up to 25% between identical runs, so one paired ratio could land
#: 10% either side of another; five rounds keep the median from resting on one.
DEFAULT_ROUNDS = 5
#: Thread counts of the raw probe, each run in every round; the faster of them in
#: a round is the baseline its pipeline runs are compared with.  On the reference
#: machine 8 threads were 20% slower than 64, 16 5% slower, and 32 to 64 within
#: noise of each other.  At 128 every request of a 120k run is in flight at once,
#: with no second wave to start once the first ends; that was as fast as 64 or up
#: to 7% faster in five of six paired rounds, so it is the stronger baseline.
DEFAULT_PROBE_THREADS = (64, 128)
#: Threads of the tuned script: what the hand-written reference used.
TUNED_THREADS = 4
#: Subsets for the slow methods: a full 120k run of each would take 5 minutes or more.
DEFAULT_AWS_KEYS = 20_000
DEFAULT_NAIVE_KEYS = 10_000
#: Dry-run sizes for the scaling section.
DEFAULT_SCALE_KEYS = (120_000, 1_200_000)
#: The weekly folder the fresh copies are seeded into.
WEEK = "2026-10-18"
REPO_ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS, help="keys per fresh copy")
    parser.add_argument(
        "--layouts",
        default=",".join(DEFAULT_LAYOUTS),
        help="comma-separated worker layouts, 'default' or [N*]QUEUES:POOL:CONCURRENCY "
        "joined with '+', e.g. sweeps:prefork:1+batches:threads:8",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="rounds of probes and layouts; ratios are medians over rounds",
    )
    parser.add_argument(
        "--probe-threads",
        default=",".join(str(n) for n in DEFAULT_PROBE_THREADS),
        help="comma-separated thread counts of the raw probe; a round's faster one is its baseline",
    )
    parser.add_argument("--aws-keys", type=int, default=DEFAULT_AWS_KEYS)
    parser.add_argument("--naive-keys", type=int, default=DEFAULT_NAIVE_KEYS)
    parser.add_argument(
        "--scale-keys",
        default=",".join(str(n) for n in DEFAULT_SCALE_KEYS),
        help="comma-separated dry-run sizes, cached between runs",
    )
    parser.add_argument("--no-scale", action="store_true", help="skip the dry-run scaling")
    parser.add_argument(
        "--no-dead-letters", action="store_true", help="skip the dead-letter queue at depth"
    )
    parser.add_argument("--cache", type=Path, default=scaling.default_cache())
    parser.add_argument("--reseed", action="store_true", help="rebuild the scaling cache")
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md", help="the report to write"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A stopped benchmark (SIGTERM, as a CI timeout or `kill` sends) unwinds like Ctrl-C,
    # so every server and worker it started is stopped by its context manager.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        layouts = [Layout.parse(spec) for spec in args.layouts.split(",")]
    except ValueError as exc:
        print(f"benchmarks: --layouts: {exc}", file=sys.stderr)
        return 2
    machine = Machine.describe()
    load_start = load_average()
    say(f"{machine.cores} cores, {machine.memory_gib:.0f} GiB, load average {load_start:.2f}")
    try:
        probe_threads = sorted({int(n) for n in args.probe_threads.split(",")})
    except ValueError:
        print(f"benchmarks: --probe-threads: {args.probe_threads!r} is not a list of counts",
              file=sys.stderr)  # fmt: skip
        return 2
    plan = _plan(layouts, args.rounds, probe_threads)
    #: The baseline of each round (its fastest probe), and every probe run.
    probes: list[Measured] = []
    probe_runs: list[Measured] = []
    pipelines: dict[int, list[report.Paired]] = {i: [] for i in range(len(layouts))}
    with tempfile.TemporaryDirectory(prefix="digest-cleanup-bench-") as tmp:
        workdir = Path(tmp)
        with RedisServer() as redis_server, WeedServer() as weed:
            endpoint = weed.endpoint_url
            sizes = {step.bucket: args.keys for steps in plan for step in steps}
            sizes |= {
                "tuned": args.keys,
                "aws": min(args.aws_keys, args.keys),
                "naive": min(args.naive_keys, args.keys),
            }
            seed_rate = _seed(endpoint, sizes)
            pids = {"weed": weed.pid or 0, "redis": redis_server.pid or 0}
            runner = Runner(workdir, redis_server.url, endpoint, pids)
            for round_, steps in enumerate(plan):
                round_probes: list[Measured] = []
                round_runs: list[tuple[int, RunResult]] = []
                for step in steps:
                    if step.probe_threads:
                        say(f"round {round_ + 1}: raw probe, {step.probe_threads} threads")
                        probe = functools.partial(
                            raw_probe, endpoint, step.bucket, PREFIX, step.probe_threads
                        )
                        round_probes.append(_with_server_cpu(weed.pid or 0, probe))
                        _done(round_probes[-1].seconds, round_probes[-1].keys)
                        continue
                    layout = layouts[step.layout]
                    say(f"round {round_ + 1}: pipeline, {layout.label()}")
                    result = runner.run(layout, step.bucket, args.keys)
                    round_runs.append((step.layout, result))
                    _done(result.seconds, result.keys)
                baseline = min(round_probes, key=lambda m: m.seconds)
                probe_runs.extend(round_probes)
                probes.append(baseline)
                for index, result in round_runs:
                    pipelines[index].append(report.Paired(result, baseline))
                    say(
                        f"round {round_ + 1}: {layouts[index].label()}: "
                        f"{result.seconds / baseline.seconds:.2f}x the faster probe"
                    )
            say(f"tuned script, stock boto3, {TUNED_THREADS} threads")
            tuned = _with_server_cpu(
                weed.pid or 0, lambda: reference_script(endpoint, "tuned", PREFIX, TUNED_THREADS)
            )
            _done(tuned.seconds, tuned.keys, probes[-1])
            say("aws s3 rm --recursive")
            aws = aws_rm(endpoint, "aws", PREFIX, workdir / "aws")
            _done(aws.seconds, aws.keys)
            say("naive loop")
            naive = naive_loop(endpoint, "naive", PREFIX)
            _done(naive.seconds, naive.keys)
    scaled = None
    if not args.no_scale:
        say("scaling: dry runs over cached keys")
        with tempfile.TemporaryDirectory(prefix="digest-cleanup-bench-scale-") as tmp:
            sizes_list = [int(n) for n in args.scale_keys.split(",")]
            scaled = scaling.measure(args.cache, sizes_list, Path(tmp), reseed=args.reseed, log=say)
    results = report.Results(
        keys=args.keys,
        machine=machine,
        load=(load_start, load_average()),
        seed_rate=seed_rate,
        probes=probes,
        probe_runs=probe_runs,
        probe_threads=probe_threads,
        pipelines=[pipelines[i] for i in range(len(layouts))],
        tuned=tuned,
        aws=aws,
        naive=naive,
        scaling=scaled,
    )
    print()
    print(report.table(results))
    print()
    print(report.headline(results))
    print("\n".join(report.acceptance(results)))
    command = ["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]
    args.output.write_text(report.markdown(results, command))
    if not args.no_dead_letters:
        say("dead-letter queue at depth")
        dead_letters.update(args.output, dead_letters.section(dead_letters.measure()))
    print(f"\nwrote {args.output}")
    return 0


@dataclasses.dataclass(frozen=True)
class Step:
    """One measurement of the plan, on its own fresh copy of the keys."""

    bucket: str
    #: The probe's thread count, or 0 for a pipeline run.
    probe_threads: int = 0
    #: The pipeline run's index into the layouts.
    layout: int = -1


def _plan(layouts: list[Layout], rounds: int, probe_threads: list[int]) -> list[list[Step]]:
    """The measurements of each round, in the order they run.

    Each round runs the probe at each thread count and every layout, each on its
    own fresh copy, so a pipeline run is compared with the faster probe of its
    own round.  The order alternates: even rounds run the probes first, odd
    rounds the pipeline first, so whatever drifts in the S3 server over a
    round (its caches, its store's compactions) favours neither side.  The first
    layout (Celery's defaults) runs in the first round only: it is the
    reference point, not a candidate.
    """
    order: list[list[Step]] = []
    for round_ in range(rounds):
        probes = [Step(f"probe-{round_}-{n}", probe_threads=n) for n in probe_threads]
        runs = [
            Step(f"pipeline-{index}-{round_}", layout=index)
            for index in range(len(layouts))
            if not (index == 0 and round_ > 0 and len(layouts) > 1)
        ]
        order.append(probes + runs if round_ % 2 == 0 else runs + probes)
    return order


def _seed(endpoint: str, sizes: dict[str, int]) -> float:
    """Seed one fresh copy per method; returns the seeding rate in keys/s."""
    total, seconds = 0, 0.0
    for bucket, keys in sizes.items():
        create_bucket(endpoint, bucket)
        stats = seed_keys(endpoint, bucket, digest_layout_keys(PREFIX, keys, WEEK))
        total, seconds = total + stats.count, seconds + stats.seconds
        say(f"  seeded {bucket}: {keys:,} keys at {stats.rate:,.0f} keys/s")
    return total / seconds if seconds else 0.0


def _with_server_cpu(weed_pid: int, measure: Callable[[], Measured]) -> Measured:
    """Run ``measure`` and add the S3 server's CPU seconds to what it reports."""
    before = cpu_seconds(weed_pid)
    measured = measure()
    measured.cpu["weed"] = cpu_seconds(weed_pid) - before
    return measured


def _done(seconds: float, keys: int, probe: Measured | None = None) -> None:
    ratio = f", {seconds / probe.seconds:.2f}x the probe" if probe else ""
    say(f"  {keys:,} keys in {seconds:.1f} s ({keys / seconds:,.0f} keys/s{ratio})")


def say(text: str) -> None:
    """Progress on stderr, so stdout carries the results only."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
