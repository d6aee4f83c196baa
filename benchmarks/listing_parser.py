"""Client CPU per ListObjectsV2 page: botocore's own parsing against the lean reader.

``python -m benchmarks.listing_parser [REPEAT NUMBER]`` prints the figures that
:mod:`digest_cleanup.kinds.s3_listing` quotes: the median of several repetitions,
per 1000-key page, for botocore's own parsing and for the lean reader (the same
XML parser, the objects read off its tree), both parsing timestamps the same way,
in the same run; ``--update BENCHMARKS.md`` also puts them in that file, replacing
the section of an earlier run.  When botocore's is no longer about twice as slow,
drop the lean reader.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
import timeit
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.report import replace_section
from tests.unit.test_s3_listing_page import (
    PAGE_KEYS,
    Parse,
    botocore_client,
    botocore_parse,
    lean_client,
    lean_parse,
    listing_call,
    page,
)


def cpu_ms(
    lean: Parse, stock: Parse, body: bytes, *, repeat: int, number: int
) -> tuple[float, float]:
    """Median CPU milliseconds per page of each, over ``repeat`` runs of ``number`` pages.

    The runs alternate, so a change in the machine's load falls on both alike.
    """
    runs: tuple[list[float], list[float]] = ([], [])
    for parse in (lean, stock):
        parse(body)  # warm: the first call builds botocore's caches
    for _ in range(repeat):
        for parse, times in zip((lean, stock), runs, strict=True):
            times.append(
                timeit.timeit(
                    functools.partial(parse, body), timer=time.process_time, number=number
                )
            )
    fast, slow = (statistics.median(times) / number * 1000 for times in runs)
    return fast, slow


#: The section of BENCHMARKS.md that ``--update`` writes.
HEADING = "## The listing parser"


def measure(repeat: int, number: int) -> list[tuple[str, str, float, float]]:
    """``(page, what, botocore ms, lean ms)`` per page kind and measurement, printed as taken."""
    rows = []
    for entities in (False, True):
        body = page(entities=entities)
        label = "10% of keys with XML escapes" if entities else "plain keys"
        print(f"{PAGE_KEYS} keys, {len(body):,} bytes, {label}; CPU ms per page, "
              f"median of {repeat} x {number}:")  # fmt: skip
        for what, lean, stock in (
            ("parse only", lean_parse, botocore_parse),
            (
                "whole list_objects_v2 call",
                listing_call(lean_client(), body),
                listing_call(botocore_client(), body),
            ),
        ):
            fast, slow = cpu_ms(lean, stock, body, repeat=repeat, number=number)
            print(f"  {what}: botocore {slow:.1f}, lean {fast:.1f} ({slow / fast:.1f}x)")
            rows.append((label, what, slow, fast))
    return rows


def section(rows: list[tuple[str, str, float, float]], repeat: int, number: int) -> str:
    """The BENCHMARKS.md section for these figures."""
    lines = [
        HEADING,
        "",
        f"Written by `python -m benchmarks.listing_parser --update BENCHMARKS.md` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC.  Client CPU per 1000-key ListObjectsV2 page "
        f"(`time.process_time`, the median of {repeat} runs of {number} pages, the two "
        "alternating), parsed by botocore's own parser and by the sweep's lean reader "
        "(`digest_cleanup/kinds/s3_listing.py`), both parsing timestamps with "
        f"`datetime.fromisoformat`, on {os.cpu_count()} cores with a load average of "
        f"{os.getloadavg()[0]:.1f} at the end (the ratio moves less than the figures):",
        "",
        "| page | measured | botocore | lean reader | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| {label} | {what} | {slow:.1f} ms | {fast:.1f} ms | {slow / fast:.1f}x |"
        for label, what, slow, fast in rows
    ]
    lines += [
        "",
        "The lean reader builds the page's tree with the XML parser botocore uses and reads "
        "each object's key, ETag and timestamp off it, then hands botocore the page without "
        "its objects, parsed again and checked to be the same tree less the objects; "
        "anything else is left to botocore.  It replaced a regular-expression reader that "
        "decoded escapes the HTML way and lost elements between objects, at about 1 ms a "
        "page more.  botocore parses each page twice (its check for an error body, then "
        "its parser), and the guard pass, which must finish before the first delete, is "
        "CPU-bound in the client.  `verify` lists with botocore as it ships.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the figures :mod:`digest_cleanup.kinds.s3_listing` quotes."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.listing_parser")
    parser.add_argument("repeat", type=int, nargs="?", default=15, help="runs per figure")
    parser.add_argument("number", type=int, nargs="?", default=20, help="pages per run")
    parser.add_argument("--update", type=Path, help="replace this section in the given file")
    args = parser.parse_args(argv)
    rows = measure(args.repeat, args.number)
    if args.update:
        replace_section(args.update, HEADING, section(rows, args.repeat, args.number))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
