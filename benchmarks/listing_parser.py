"""Client CPU per ListObjectsV2 page: botocore's own parsing against the lean parser.

``python -m benchmarks.listing_parser [REPEAT NUMBER]`` prints the figures that
:mod:`digest_cleanup.kinds.s3_listing` quotes: the median of several repetitions,
per 1000-key page, for botocore's own parsing and for the lean parser, both
parsing timestamps the same way, in the same run.  When botocore's is no longer
several times slower, drop the lean parser.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
import timeit

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


def main(repeat: int = 15, number: int = 20) -> None:
    """Print the figures :mod:`digest_cleanup.kinds.s3_listing` quotes."""
    for entities in (False, True):
        body = page(entities=entities)
        label = "10% of keys with XML entities" if entities else "plain keys"
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


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
