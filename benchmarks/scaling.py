"""Scaling: the guard pass (a dry run) over 120k and 1.2M keys, seeded once and kept.

Seeding 1.2M objects takes minutes, so the data lives in a ``weed`` data
directory under the benchmark cache (``$XDG_CACHE_HOME/digest-cleanup-bench``,
else ``~/.cache/digest-cleanup-bench``), outside the repository, and later runs
reuse it.  A manifest, written only once seeding has finished, says what the
directory holds; anything else (no manifest, another layout, ``--reseed``) and
the directory is wiped and seeded again.

The 1.2M set spans ten weekly folders of 120k digests each, as a bucket holding
ten weeks of artifacts would; the 120k set is one week.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

from benchmarks.pipeline import PREFIX, Layout, Runner, RunResult
from digest_cleanup.demo.seed import SeedStats, create_bucket, digest_layout_keys, seed_keys
from tests.rig.servers import RedisServer, WeedServer

#: Bump when the seeded layout changes, so old caches are rebuilt.
LAYOUT_VERSION = 1
#: Digests per weekly folder.
WEEK_SIZE = 120_000
#: The oldest weekly folder of a cached bucket.
FIRST_WEEK = date(2026, 9, 13)
#: The sweep alone: one worker that consumes only the sweep queue, one pool process.
SWEEP_ONLY = Layout.parse("sweeps:prefork:1")


@dataclasses.dataclass(frozen=True)
class DryRun:
    """One dry run over a cached bucket."""

    keys: int
    result: RunResult

    @property
    def peak_mib(self) -> float:
        return (self.result.sweep_peak_kib or 0) / 1024

    @property
    def baseline_mib(self) -> float:
        return (self.result.sweep_baseline_kib or 0) / 1024


@dataclasses.dataclass(frozen=True)
class Scaling:
    """The dry runs, and how the cache was obtained."""

    runs: list[DryRun]
    cache: Path
    #: Seeding of this invocation, when the cache had to be built.
    seeded: SeedStats | None


def default_cache() -> Path:
    """The benchmark cache directory: outside any repository, reused across runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "digest-cleanup-bench"


def bucket_for(keys: int) -> str:
    return f"scale-{keys}"


def weeks(keys: int) -> list[str]:
    """Weekly folder names (Sundays), one per :data:`WEEK_SIZE` keys, oldest first."""
    count = max(1, -(-keys // WEEK_SIZE))
    return [(FIRST_WEEK + timedelta(weeks=i)).isoformat() for i in range(count)]


def measure(
    cache: Path,
    sizes: list[int],
    workdir: Path,
    *,
    reseed: bool,
    log: Callable[[str], None] = print,
) -> Scaling:
    """Run a dry run over each cached size (seeding the cache first if needed)."""
    manifest_path = cache / "manifest.json"
    wanted = {"layout": LAYOUT_VERSION, "buckets": {bucket_for(n): n for n in sizes}}
    current = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    fresh = reseed or current != wanted
    if fresh and cache.exists():
        log(f"  rebuilding the cache at {cache}")
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    seeded: SeedStats | None = None
    with WeedServer(data_dir=cache / "weed") as weed, RedisServer() as redis_server:
        if fresh:
            seeded = _seed(weed.endpoint_url, sizes, log)
            manifest_path.write_text(json.dumps(wanted, indent=2) + "\n")
        else:
            log(f"  reusing {sum(sizes):,} cached keys in {cache}")
        pids = {"weed": weed.pid or 0, "redis": redis_server.pid or 0}
        runner = Runner(workdir, redis_server.url, weed.endpoint_url, pids)
        runs = []
        for keys in sizes:
            result = runner.run(SWEEP_ONLY, bucket_for(keys), keys, dry_run=True)
            listed = int(result.run.get("listed", 0))
            if listed != keys:
                raise RuntimeError(
                    f"the cached bucket {bucket_for(keys)} holds {listed} keys, not {keys}; "
                    "run again with BENCH_ARGS=--reseed"
                )
            log(f"  dry run over {keys:,} keys: {result.seconds:.1f} s")
            runs.append(DryRun(keys, result))
    return Scaling(runs=runs, cache=cache, seeded=seeded)


def _seed(endpoint: str, sizes: list[int], log: Callable[[str], None]) -> SeedStats:
    total, seconds = 0, 0.0
    for keys in sizes:
        bucket = bucket_for(keys)
        create_bucket(endpoint, bucket, exist_ok=True)
        for i, week in enumerate(weeks(keys)):
            count = min(WEEK_SIZE, keys - i * WEEK_SIZE)
            stats = seed_keys(endpoint, bucket, digest_layout_keys(PREFIX, count, week))
            total, seconds = total + stats.count, seconds + stats.seconds
        log(f"  seeded {bucket}: {keys:,} keys ({total / seconds:,.0f} keys/s so far)")
    return SeedStats(count=total, seconds=seconds)
