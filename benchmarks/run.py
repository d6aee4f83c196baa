"""``make bench``: the 120k weekly run end to end, against the alternatives, in two tables.

It starts a ``weed mini`` and a Redis on free loopback ports, pins ``weed`` to a
core of its own and everything else to the other cores (this process, so every
thread and subprocess it starts: probe threads, s5cmd, the AWS CLI, the Celery
workers; and Redis), and seeds a fresh copy of the same keys for every
measurement, straight into ``weed``.

The local table: in each of ``--rounds`` rounds it runs the raw probe at each of
its thread counts twice (each key with its listed ETag, as the pipeline sends
them, and bare), ``s5cmd rm`` and the pipeline under each worker layout, probes
and s5cmd first in even rounds and last in odd ones, so every pipeline run is
paired with the faster run of its own round that does the same work, and
neither side always goes first.  Then a tuned stock-boto3 script, ``aws s3 rm
--recursive`` and a per-key loop (the last two on subsets, extrapolated), and a
dry run over 120k and 1.2M cached keys shows how the sweep scales.

The table against a model of AWS S3's request-rate limits: the pipeline under
its shared delete budget, stock boto3 with standard and with adaptive retries,
s5cmd and the AWS CLI, each through its own fresh model, against a floor of the
keys at 3,500/s after one listing.

It prints both tables and writes BENCHMARKS.md at the repository root;
``--no-local`` runs the second table alone and replaces only its section of the
file, and ``--no-aws-model`` leaves that section out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from benchmarks import aws_table, batch_checks, dead_letters, report, scaling
from benchmarks.alternatives import (
    Measured,
    aws_rm,
    naive_loop,
    raw_probe,
    reference_script,
    s5cmd_rm,
)
from benchmarks.aws_table import ModelTable
from benchmarks.environment import (
    Machine,
    Pinning,
    cpu_seconds,
    load_average,
    pin_servers,
    set_affinity,
)
from benchmarks.pipeline import PREFIX, Layout, Runner, RunResult
from digest_cleanup.demo.seed import create_bucket, digest_layout_keys, seed_keys
from tests.rig.servers import RedisServer, WeedServer

#: The weekly run of the ~120k-customer digest.
DEFAULT_KEYS = 120_000
#: Worker layouts tried (see :meth:`Layout.parse`): one plain ``celery -A digest_cleanup
#: worker``, which runs the pool the app configures (threads, 64 of them: deletes wait on
#: S3, and threads cost less CPU than processes on a machine whose cores the S3 server
#: needs), with the targets file's default batch size, as shipped; and the same with
#: conditional deletes off, to show what they cost.  The sweep no longer gets a worker of
#: its own by default; ``sweeps:prefork:1+batches:threads:64@1000`` still measures that.
DEFAULT_LAYOUTS = ("default", "default!unconditional")
#: Rounds of (probes, s5cmd, layouts): the machine may be shared, so every pipeline run
#: is paired with the baselines of its own round, and the median of the paired ratios
#: is reported.  On the reference machine the S3 server's CPU per deleted key varied by
#: up to 25% between identical runs, so one paired ratio could land 10% either side of
#: another; three rounds keep the median off a single one.  More would cost seeding
#: time: a round is five fresh copies, and seeding runs at about 1,150 keys/s here, so
#: about 105 s a 120k copy, several times what deleting one takes.
DEFAULT_ROUNDS = 3
#: Thread counts of the raw probe, each run conditional and unconditional in every round.
#: On the reference machine 8 threads were 20% slower than 64, 16 5% slower, and 32 to
#: 64 within noise of each other.  At 128 every request of a 120k run is in flight at
#: once, with no second wave to start once the first ends; that was as fast as 64 or up
#: to 7% faster in five of six paired rounds, so it is the stronger baseline, and one
#: thread count keeps a round at five copies.
DEFAULT_PROBE_THREADS = (128,)
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
    parser.add_argument(
        "--keys", type=int, default=DEFAULT_KEYS, help="keys per fresh copy, in both tables"
    )
    parser.add_argument(
        "--layouts",
        default=",".join(DEFAULT_LAYOUTS),
        help="comma-separated worker layouts of the local table, 'default' or "
        "[N*]QUEUES:POOL:CONCURRENCY joined with '+', then @BATCH and !unconditional, e.g. "
        "sweeps:prefork:1+batches:threads:64@1000 (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="rounds of probes, s5cmd and layouts; ratios are medians over rounds",
    )
    parser.add_argument(
        "--probe-threads",
        default=",".join(str(n) for n in DEFAULT_PROBE_THREADS),
        help="comma-separated thread counts of the raw probe, each run conditional and not; "
        "a round's faster run of each kind is its baseline",
    )
    parser.add_argument(
        "--aws-keys",
        type=int,
        default=DEFAULT_AWS_KEYS,
        help="keys `aws s3 rm --recursive` deletes (in both tables), extrapolated to --keys",
    )
    parser.add_argument(
        "--naive-keys",
        type=int,
        default=DEFAULT_NAIVE_KEYS,
        help="keys the one-DeleteObject-per-key loop deletes, extrapolated to --keys",
    )
    parser.add_argument(
        "--scale-keys",
        default=",".join(str(n) for n in DEFAULT_SCALE_KEYS),
        help="comma-separated dry-run sizes, cached between runs",
    )
    parser.add_argument(
        "--no-local",
        action="store_true",
        help="skip the local table (and the scaling, which belongs to it); the table against "
        "the model of AWS S3 then replaces only its own section of --output",
    )
    parser.add_argument(
        "--no-aws-model",
        action="store_true",
        help="skip the table against the model of AWS S3; --output then has no such section",
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
    if args.no_local and args.no_aws_model:
        print("benchmarks: --no-local and --no-aws-model leave nothing to run", file=sys.stderr)
        return 2
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
    plan = _plan(len(layouts), args.rounds, probe_threads)
    allowed = os.sched_getaffinity(0)
    local: Local | None = None
    model: ModelTable | None = None
    with tempfile.TemporaryDirectory(prefix="digest-cleanup-bench-") as tmp:
        workdir = Path(tmp)
        with RedisServer() as redis_server, WeedServer() as weed:
            endpoint = weed.endpoint_url
            pids = {"weed": weed.pid or 0, "redis": redis_server.pid or 0}
            # Before anything else starts, so every thread and process after this inherits it.
            pinning = pin_servers(pids["weed"], [pids["redis"]])
            say(f"CPU pinning: {pinning.describe()}")
            sizes: dict[str, int] = {}
            if not args.no_local:
                sizes |= {step.bucket: args.keys for steps in plan for step in steps}
                sizes |= {
                    "tuned": args.keys,
                    "aws": min(args.aws_keys, args.keys),
                    "naive": min(args.naive_keys, args.keys),
                }
            if not args.no_aws_model:
                sizes |= aws_table.copies(args.keys, args.aws_keys)
            seed_rate = _seed(endpoint, sizes)
            if not args.no_local:
                runner = Runner(workdir, redis_server.url, endpoint, pids)
                local = _local(
                    plan, layouts, args.keys, runner, endpoint, pids["weed"], workdir, pinning
                )
            if not args.no_aws_model:
                model = aws_table.measure(
                    endpoint, redis_server.url, pids, workdir, args.keys, log=say
                )
    # The scaling and dead-letter sections start servers of their own, unpinned.
    set_affinity(os.getpid(), allowed)
    command = ["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]
    if local is not None:
        scaled = None
        if not args.no_scale:
            say("scaling: dry runs over cached keys")
            with tempfile.TemporaryDirectory(prefix="digest-cleanup-bench-scale-") as tmp:
                sizes_list = [int(n) for n in args.scale_keys.split(",")]
                scaled = scaling.measure(
                    args.cache, sizes_list, Path(tmp), reseed=args.reseed, log=say
                )
        results = report.Results(
            keys=args.keys,
            machine=machine,
            load=(load_start, load_average()),
            seed_rate=seed_rate,
            pinning=pinning,
            rounds=local.rounds,
            probe_threads=probe_threads,
            pipelines=[local.pipelines[i] for i in range(len(layouts))],
            tuned=local.tuned,
            aws=local.aws,
            naive=local.naive,
            scaling=scaled,
            model=model,
        )
        print()
        print(report.table(results))
        print()
        print(report.headline(results))
        print("\n".join(report.acceptance(results)))
        args.output.write_text(report.markdown(results, command))
    if model is not None:
        print()
        print(report.model_table(model))
        print()
        print(report.model_headline(model))
        print("\n".join(report.model_acceptance(model)))
        if local is None:
            report.replace_section(
                args.output, aws_table.HEADING, report.model_section(model, command)
            )
    if not args.no_dead_letters:
        say("dead-letter queue at depth")
        dead_letters.update(args.output, dead_letters.section(dead_letters.measure()))
    if not args.no_local:
        say("the delete-time checks per batch")
        text = batch_checks.section(batch_checks.measure())
        dead_letters.update(args.output, text, batch_checks.HEADING)
    print(f"\nwrote {args.output}")
    return 0


@dataclasses.dataclass
class Local:
    """What the local table measured, before the scaling joins it."""

    rounds: list[report.Round]
    #: Per layout index, its runs paired with their rounds.
    pipelines: dict[int, list[report.Paired]]
    tuned: Measured
    aws: Measured
    naive: Measured


def _local(
    plan: list[list[Step]],
    layouts: list[Layout],
    keys: int,
    runner: Runner,
    endpoint: str,
    weed_pid: int,
    workdir: Path,
    pinning: Pinning,
) -> Local:
    """Every round of the plan, then the tuned script, ``aws s3 rm`` and the naive loop."""
    rounds: list[report.Round] = []
    pipelines: dict[int, list[report.Paired]] = {i: [] for i in range(len(layouts))}
    for number, steps in enumerate(plan, 1):
        runs: list[Measured] = []
        results: list[tuple[int, RunResult]] = []
        for step in steps:
            if step.kind == "probe":
                what = "conditional" if step.conditional else "unconditional"
                say(f"round {number}: raw probe, {what}, {step.probe_threads} threads")
                probe = functools.partial(
                    raw_probe,
                    endpoint,
                    step.bucket,
                    PREFIX,
                    step.probe_threads,
                    conditional=step.conditional,
                )
                runs.append(_with_server_cpu(weed_pid, probe))
                _done(runs[-1].seconds, runs[-1].keys)
            elif step.kind == "s5cmd":
                say(f"round {number}: s5cmd rm")
                s5 = functools.partial(s5cmd_rm, endpoint, step.bucket, PREFIX, workdir / "s5")
                runs.append(_with_server_cpu(weed_pid, s5))
                _done(runs[-1].seconds, runs[-1].keys)
            else:
                layout = layouts[step.layout]
                say(f"round {number}: pipeline, {layout.label()}")
                result = runner.run(layout, step.bucket, keys)
                if not pinning.skipped and not result.worker_cores <= pinning.clients:
                    say(f"  warning: workers ran on CPU {sorted(result.worker_cores)}")
                results.append((step.layout, result))
                _done(result.seconds, result.keys)
        round_ = report.Round(tuple(runs))
        rounds.append(round_)
        for index, result in results:
            paired = report.Paired(result, round_)
            pipelines[index].append(paired)
            against = "conditional probe" if result.layout.conditional else "unconditional run"
            say(f"round {number}: {result.label()}: {paired.ratio:.2f}x the faster {against}")
    say(f"tuned script, stock boto3, {TUNED_THREADS} threads")
    tuned = _with_server_cpu(
        weed_pid, lambda: reference_script(endpoint, "tuned", PREFIX, TUNED_THREADS)
    )
    _done(tuned.seconds, tuned.keys, rounds[-1].unconditional)
    say("aws s3 rm --recursive")
    aws = aws_rm(endpoint, "aws", PREFIX, workdir / "aws")
    _done(aws.seconds, aws.keys)
    say("naive loop")
    naive = naive_loop(endpoint, "naive", PREFIX)
    _done(naive.seconds, naive.keys)
    return Local(rounds, pipelines, tuned, aws, naive)


@dataclasses.dataclass(frozen=True)
class Step:
    """One measurement of the plan, on its own fresh copy of the keys."""

    bucket: str
    kind: Literal["probe", "s5cmd", "pipeline"]
    #: The probe's thread count.
    probe_threads: int = 0
    #: The probe sends each key's listed ETag.
    conditional: bool = False
    #: The pipeline run's index into the layouts.
    layout: int = -1


def _plan(layouts: int, rounds: int, probe_threads: list[int]) -> list[list[Step]]:
    """The measurements of each round, in the order they run.

    Each round runs the probe at each thread count, conditional and not, s5cmd,
    and every layout, each on its own fresh copy, so a pipeline run is compared
    with the baselines of its own round.  The order alternates: even rounds run
    the probes and s5cmd first, odd rounds the pipeline first, so whatever
    drifts in the S3 server over a round (its caches, its store's compactions)
    favours neither side.
    """
    order: list[list[Step]] = []
    for round_ in range(rounds):
        baselines = [
            Step(
                f"probe-{round_}-{n}-{'cond' if conditional else 'bare'}",
                "probe",
                probe_threads=n,
                conditional=conditional,
            )
            for n in probe_threads
            for conditional in (True, False)
        ]
        baselines.append(Step(f"s5cmd-{round_}", "s5cmd"))
        runs = [Step(f"pipeline-{i}-{round_}", "pipeline", layout=i) for i in range(layouts)]
        order.append(baselines + runs if round_ % 2 == 0 else runs + baselines)
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
