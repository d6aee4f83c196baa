"""The dead-letter queue at depth: one entry's operations with 10 and with 50,000 entries.

Showing, redriving and purging one entry, and listing one run's entries, must
cost the same however many entries wait (see :mod:`digest_cleanup.store.dead_letters`).
This fills a dedicated Redis with N entries, as workers publish them (Celery
messages on the dead-letter queue, absorbed into the index by the first read),
then times each operation on one entry, at each depth, in the same invocation.

``python -m benchmarks.dead_letters`` prints the table; ``--update BENCHMARKS.md``
also puts it in that file, replacing the section of an earlier run.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from digest_cleanup.app import create_app
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.model.dead_letters import make_entry
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.rig.servers import RedisServer

#: Queue depths compared: a handful, and far past a bad week.
DEPTHS = (10, 50_000)
#: Timed repetitions of each operation at each depth; the median is reported.
REPEATS = 15
#: Keys per entry: the card's 500-key batches.
KEYS_PER_ENTRY = 500
#: Runs the entries are spread over, so that one run's entries are a small share.
RUNS = 50
HEADING = "## Dead-letter queue at depth"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dead_letters", description=__doc__)
    parser.add_argument("--update", type=Path, help="replace this section in the given file")
    args = parser.parse_args(argv)
    text = section(measure())
    print(text)
    if args.update:
        update(args.update, text)
    return 0


def measure() -> dict[int, dict[str, float]]:
    """Median seconds of each operation, by queue depth."""
    results: dict[int, dict[str, float]] = {}
    with RedisServer() as server:
        for depth in DEPTHS:
            settings = Settings(broker_url=server.url, key_prefix=f"bench{depth}")
            results[depth] = _at_depth(settings, depth)
    return results


def _at_depth(settings: Settings, depth: int) -> dict[str, float]:
    runtime = Runtime(settings)
    runtime.redis.flushall()
    template = _published(settings)
    dlq = runtime.dead_letters
    pipe = runtime.redis.pipeline(transaction=False)
    for n in range(depth):
        pipe.lpush(settings.dead_letter_queue, _variant(template, n))
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    started = time.perf_counter()
    dlq.absorb()
    absorbed = time.perf_counter() - started
    middle = f"dl-bench-{depth // 2:06d}"
    fresh = iter(range(depth, depth + 10 * REPEATS))

    def add_one() -> str:
        # Keeps the depth where it was: each redrive or purge takes one entry away.
        n = next(fresh)
        runtime.redis.lpush(settings.dead_letter_queue, _variant(template, n))
        dlq.absorb()
        return f"dl-bench-{n:06d}"

    timings = {
        "show one entry": _median(lambda _: dlq.get(middle)),
        "list one run's entries": _median(lambda _: dlq.entries(run="bench-run-7")),
        "redrive one entry": _median(lambda i: dlq.redrive_one(dlq.get(i)), add_one),
        "purge one entry": _median(lambda i: dlq.purge([dlq.get(i)], "benchmark"), add_one),
        "count entries and keys (a metrics scrape)": _median(lambda _: dlq.stats()),
    }
    timings["absorb every entry, once"] = absorbed
    runtime.close()
    return timings


def _published(settings: Settings) -> str:
    """One dead-letter message exactly as a worker publishes it, read back from Redis."""
    keys = [f"statements/2026-10-18/cust-{i:07d}.pdf" for i in range(KEYS_PER_ENTRY)]
    payload = BatchPayload(
        run_id="bench-run-0",
        target="statements",
        batch_id="bench-b00001",
        seq=1,
        cutoff="2026-10-25T03:00:00+00:00",
        keys=keys,
        conditions=['"0123456789abcdef0123456789abcdef"'] * len(keys),
        scope="bench",
    )
    dead = {k: KeyResult(k, Outcome.PERMANENT, "AccessDenied", "Access Denied") for k in keys}
    letter = make_entry(payload, dead, "permanent_error")
    runtime = create_app(settings).digest_cleanup_runtime
    runtime.dispatcher.send_dead_letter(dataclasses.replace(letter, entry_id="dl-bench-000000"))
    client = runtime.redis
    raw = client.rpop(settings.dead_letter_queue)
    assert raw is not None
    text: str = raw.decode()
    return text


def _variant(template: str, n: int) -> str:
    """The template with its own entry id and run, as many distinct entries need."""
    message = json.loads(template)
    message["headers"]["id"] = f"dl-bench-{n:06d}"
    args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    kwargs["run_id"] = message["headers"]["dc_run"] = f"bench-run-{n % RUNS}"
    message["body"] = base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()
    return json.dumps(message)


def _median(operation: Callable[[str], object], setup: Callable[[], str] = lambda: "") -> float:
    """Median seconds of ``operation(setup())``, the setup itself not timed."""
    samples = []
    for _ in range(REPEATS):
        subject = setup()
        started = time.perf_counter()
        operation(subject)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def section(results: dict[int, dict[str, float]]) -> str:
    small, large = DEPTHS[0], DEPTHS[-1]
    lines = [
        HEADING,
        "",
        f"Written by `make bench` (alone: `python -m benchmarks.dead_letters`) on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} "
        f"UTC, against a dedicated Redis on loopback. Each entry holds {KEYS_PER_ENTRY} keys "
        f"with their ETags; the entries are spread over {RUNS} runs. Medians of {REPEATS} "
        "repetitions, and the ratio of the two depths measured in the same invocation.",
        "",
        f"| operation | {small:,} entries | {large:,} entries | ratio |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in results[small].items():
        other = results[large][name]
        ratio = other / seconds if seconds else float("nan")
        note = "" if name.startswith("absorb") else f"{ratio:.2f}x"
        if name.startswith("absorb"):
            note = "once per entry"
        elif name.startswith("list one run"):
            note += f" (the run holds {large // RUNS:,} entries, not {small // RUNS or 1:,})"
        lines.append(f"| {name} | {seconds * 1000:.2f} ms | {other * 1000:.2f} ms | {note} |")
    lines += [
        "",
        "Showing, redriving and purging one entry read and change only that entry's keys "
        "in the index, so they cost the same at any depth. Listing a run's entries grows "
        "with that run's own entries only. Each message is absorbed once, by the first "
        "read after a worker published it.",
        "",
    ]
    return "\n".join(lines)


def update(path: Path, text: str, heading: str = HEADING) -> None:
    """Put ``text`` in ``path`` in place of an earlier ``heading`` section, or at the end."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    path.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
