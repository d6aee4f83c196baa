"""Cutting one long prefix into key ranges that can be listed at the same time.

A prefix without a small set of sub-prefixes (fewer than two, or more than fit
one delimited page), such as the one weekly folder a weekly run expires, is cut
into *key ranges* instead, once its first page shows it is longer than a page
(see :mod:`~digest_cleanup.kinds.s3_shards`).  :func:`split` finds the
boundaries with a few one-key listing requests: it follows the keys' common stem
and the distinct characters that come after it, and cuts the character groups
into as many runs as there are ranges to list at once, assuming sibling groups
hold about as many keys each.  The ranges ``(lower, next lower]`` cover the key
space exactly whatever the keys are; a poor guess only makes them uneven.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Sorts after every key that starts with a given stem followed by anything else
#: (the highest code point; XML 1.0 allows it, so it can travel in a request).
TOP = "\U0010ffff"
#: One-key listing requests :func:`split` may spend finding the ranges.
SPLIT_PROBES = 40
#: Character groups :func:`split` aims for before cutting them into ranges: four
#: for each of the :data:`~digest_cleanup.kinds.s3_shards.LIST_SHARDS` ranges.
SPLIT_GROUPS = 16


def split(client: S3Client, bucket: str, prefix: str, after: str, parts: int) -> list[str]:
    """Up to ``parts - 1`` boundaries that cut the keys under ``prefix`` after ``after``.

    It costs at most :data:`SPLIT_PROBES` one-key listing requests.  The common
    stem of the remaining keys is found by bisection; then the heaviest character
    group is opened into its children (one request per distinct next character)
    until there are :data:`SPLIT_GROUPS` groups, siblings weighing the same.  The
    boundaries are cut between groups at equal shares of weight.  An empty list
    means there is nothing worth splitting.
    """
    probe = _Probe(client, bucket, prefix, after)
    first = probe.next_after(after)
    if first is None:
        return []
    groups: dict[str, float] = {probe.stem(first): 1.0}
    leaves: set[str] = set()
    while len(groups) < SPLIT_GROUPS:
        open_ = [g for g in groups if g not in leaves]
        if not open_:
            break
        heaviest = max(open_, key=lambda g: (groups[g], g))
        children = probe.children(heaviest)
        if children is None:  # out of requests
            break
        if not children:
            leaves.add(heaviest)
            continue
        weight = groups.pop(heaviest) / len(children)
        groups.update((heaviest + c, weight) for c in children)
    return _cut(sorted(groups.items()), parts, after)


def _cut(groups: list[tuple[str, float]], parts: int, after: str) -> list[str]:
    """Boundaries after the groups where the running weight crosses each share."""
    total = sum(w for _, w in groups)
    bounds: list[str] = []
    running = 0.0
    for stem, weight in groups[:-1]:
        running += weight
        if running >= total * (len(bounds) + 1) / parts - 1e-9:
            bound = stem + TOP
            if bound > after and (not bounds or bound > bounds[-1]):
                bounds.append(bound)
        if len(bounds) == parts - 1:
            break
    return bounds


class _Probe:
    """One-key listing requests under a prefix, within a budget."""

    def __init__(self, client: S3Client, bucket: str, prefix: str, after: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.after = after
        self.left = SPLIT_PROBES

    def next_after(self, key: str) -> str | None:
        """The first key under the prefix that sorts after ``key``, if any."""
        self.left -= 1
        response = self.client.list_objects_v2(
            Bucket=self.bucket, Prefix=self.prefix, StartAfter=key, MaxKeys=1
        )
        contents = response.get("Contents") or []
        return str(contents[0]["Key"]) if contents else None

    def stem(self, first: str) -> str:
        """The longest start of ``first`` that every remaining key shares (by bisection)."""
        low, high = len(self.prefix), len(first)  # the prefix is shared; the whole key may not be
        while low < high and self.left > 0:
            mid = (low + high + 1) // 2
            if self.next_after(first[:mid] + TOP) is None:
                low = mid
            else:
                high = mid - 1
        return first[:low]

    def children(self, stem: str) -> list[str] | None:
        """The distinct characters after ``stem`` in the remaining keys; None past the budget."""
        found: list[str] = []
        after = max(stem, self.after)
        while self.left > 0:
            key = self.next_after(after)
            if key is None or not key.startswith(stem) or len(key) == len(stem):
                return found
            found.append(key[len(stem)])
            after = stem + found[-1] + TOP
        return None
