"""Listing a prefix several sub-prefixes at a time, with a cursor that resumes exactly.

ListObjectsV2 pages are sequential (each needs the previous one's position), so
one listing keeps one request in flight, and the client and the server take
turns.  A digest bucket groups keys by week (``statements/2026-10-18/...``), and
the sub-prefixes one ``Delimiter="/"`` request names are independent ranges of
the key space.  :func:`pages` lists up to :data:`LIST_SHARDS` of them at once on
threads and yields pages as they arrive, from whichever sub-prefix has one.

The pages then no longer come in key order, so a page's last key cannot be the
cursor.  Instead each page carries a *sharded cursor*: a small JSON document,
marked by a leading NUL (no S3 key can hold one: listings are XML 1.0), saying
which sub-prefixes are finished, how far each open one got, and whether the keys
directly under the prefix were given.  ``pages(start_after=that cursor)`` lists
exactly what had not been given yet, so the sweep's checkpoints resume as
before: nothing counted twice, nothing skipped.  A sub-prefix that appears only
after a scan began sorts among the finished ones or not; either way its keys
are newer than the cutoff, which a fresh upload or copy always is.

A prefix without a small set of sub-prefixes (fewer than two, or more than fit
one delimited page), such as the one weekly folder a weekly run expires, is cut
into *key ranges* instead (see :mod:`~digest_cleanup.kinds.s3_ranges`), once its
first page shows it is longer than a page.  The boundaries travel in the cursor,
so a resumed scan lists the very same ranges.

Memory stays flat: the threads hand pages over through one bounded queue.  A
listing of one page or less is listed sequentially with plain-key cursors, as
is a scan resumed from a plain-key cursor: a scan keeps the cursor style it
started with.

It is long because the cursor, both ways of cutting a prefix and the threads
that list the pieces must agree exactly on what was given; apart, each would
restate the others' rules.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from digest_cleanup.errors import PermanentError
from digest_cleanup.kinds.s3_ranges import split

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ListObjectsV2OutputTypeDef, ObjectTypeDef

#: Sub-prefixes listed at the same time by one listing.  Measured on a 2-core
#: machine against ``weed mini`` (four weekly folders): 2 streams listed 1.6x as
#: fast as one, 4 streams 1.7x.
LIST_SHARDS = 4
#: Pages the listing threads may hold ready for the consumer, together.
READ_AHEAD_PAGES = 2 * LIST_SHARDS
#: Marks a sharded cursor; never the first character of an S3 key.
MARK = "\x00"
#: Seconds a blocked producer waits before checking whether the listing was dropped.
_POLL_SECONDS = 0.2


class _Done(enum.Enum):
    """The end of one shard's listing, as its producer queues it."""

    DONE = "done"


_DONE: Final = _Done.DONE

Objects = list["ObjectTypeDef"]
#: ListObjectsV2 paginator arguments.  A plain dict: ``MaxKeys`` is not among the
#: stubs' paginate arguments, yet botocore sends it with every page's request.
PageRequest = dict[str, Any]


@dataclasses.dataclass
class ShardCursor:
    """How far a sharded listing got."""

    #: Every sub-prefix up to and including this one is finished.
    through: str = ""
    #: Finished sub-prefixes past ``through``.
    closed: list[str] = dataclasses.field(default_factory=list)
    #: Started sub-prefixes and the last key given from each.
    open: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Whether the keys directly under the prefix were given.
    direct: bool = False
    #: Key-range mode: the lower bound of each range, in order; a range runs up to
    #: and including the next lower bound.  Empty in sub-prefix mode.
    bounds: list[str] = dataclasses.field(default_factory=list)

    def encode(self) -> str:
        return MARK + json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> ShardCursor:
        return cls(**json.loads(text[len(MARK) :]))

    def done(self, sub: str) -> bool:
        return sub <= self.through or sub in self.closed


def pages(
    client: S3Client, bucket: str, prefix: str, start_after: str | None, page_size: int
) -> Iterator[tuple[Objects, str]]:
    """Every object under ``prefix`` not yet given, page by page, each with its cursor."""
    if start_after is not None and not start_after.startswith(MARK):
        yield from _sequential(client, bucket, prefix, start_after, page_size, None)
        return
    state = ShardCursor.decode(start_after) if start_after else ShardCursor()
    if state.bounds:
        yield from _merged(client, bucket, prefix, page_size, state, _Ranges(prefix, state.bounds))
        return
    found = segments(client, bucket, prefix, page_size, complete=start_after is not None)
    if found is None:
        yield from _ranged(client, bucket, prefix, page_size)
        return
    direct, subs = found
    if not state.direct:
        state.direct = True
        if direct:
            yield direct, state.encode()
    yield from _merged(client, bucket, prefix, page_size, state, _SubPrefixes(subs))


def _ranged(
    client: S3Client, bucket: str, prefix: str, page_size: int
) -> Iterator[tuple[Objects, str]]:
    """A prefix without sub-prefixes to shard by: its first page, then key ranges at once."""
    first = checked(client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=page_size), prefix)
    contents: Objects = first.get("Contents", [])
    if not contents:
        return
    last = contents[-1]["Key"]
    bounds = split(client, bucket, prefix, last, LIST_SHARDS) if first.get("IsTruncated") else []
    if not bounds:  # one page, or nothing to split by: carry on plainly
        yield contents, last
        if first.get("IsTruncated"):
            yield from _sequential(client, bucket, prefix, last, page_size, None)
        return
    state = ShardCursor(direct=True, bounds=[last, *bounds])
    yield contents, state.encode()
    yield from _merged(client, bucket, prefix, page_size, state, _Ranges(prefix, state.bounds))


def _merged(
    client: S3Client,
    bucket: str,
    prefix: str,
    page_size: int,
    state: ShardCursor,
    shards: _SubPrefixes | _Ranges,
) -> Iterator[tuple[Objects, str]]:
    """List the shards not finished yet, :data:`LIST_SHARDS` at once, as pages arrive."""
    todo = [s for s in shards.ids if not state.done(s)]
    with _Lister(client, bucket, page_size) as lister:
        for shard in todo[:LIST_SHARDS]:
            lister.start(shard, *shards.listing(shard, state.open.get(shard)))
        waiting = todo[LIST_SHARDS:]
        while lister.active:
            shard, key = lister.next()
            if key is _DONE:
                _close(state, shard, shards.ids)
                if waiting:
                    nxt = waiting.pop(0)
                    lister.start(nxt, *shards.listing(nxt, state.open.get(nxt)))
                continue
            state.open[shard] = key[-1]["Key"]
            yield key, state.encode()


@dataclasses.dataclass(frozen=True)
class _SubPrefixes:
    """Shards named by sub-prefix: each lists its own prefix to the end."""

    ids: list[str]

    def listing(self, shard: str, given: str | None) -> tuple[str, str | None, str | None]:
        return shard, given, None


@dataclasses.dataclass(frozen=True)
class _Ranges:
    """Shards named by lower bound: each lists the prefix up to the next lower bound."""

    prefix: str
    ids: list[str]

    def listing(self, shard: str, given: str | None) -> tuple[str, str | None, str | None]:
        at = self.ids.index(shard)
        upper = self.ids[at + 1] if at + 1 < len(self.ids) else None
        return self.prefix, given or shard, upper


def segments(
    client: S3Client, bucket: str, prefix: str, page_size: int, *, complete: bool = False
) -> tuple[Objects, list[str]] | None:
    """The keys directly under ``prefix`` and its sorted sub-prefixes, or None to list plainly.

    A listing is sharded only when one delimited page names at least two
    sub-prefixes; with ``complete`` (resuming a sharded listing) every page is read.
    """
    params: PageRequest = {
        "Bucket": bucket,
        "Prefix": prefix,
        "Delimiter": "/",
        "MaxKeys": page_size,
    }
    direct: Objects = []
    subs: list[str] = []
    for response in listed(client.get_paginator("list_objects_v2").paginate(**params), prefix):
        direct += response.get("Contents", [])
        subs += [p["Prefix"] for p in response.get("CommonPrefixes", [])]
        if response.get("IsTruncated") and not complete:
            return None
    if len(subs) < 2 and not complete:
        return None
    return direct, sorted(subs)


def listed(
    responses: Iterable[ListObjectsV2OutputTypeDef], prefix: str
) -> Iterator[ListObjectsV2OutputTypeDef]:
    """Each page of a ListObjectsV2 paginator, each checked with :func:`checked`."""
    for response in responses:
        yield checked(response, prefix)


def checked(response: ListObjectsV2OutputTypeDef, prefix: str) -> ListObjectsV2OutputTypeDef:
    """A ListObjectsV2 page, unless it cannot be followed or names a key it could not write.

    botocore's paginator ends quietly at a page that says ``IsTruncated`` but gives
    no ``NextContinuationToken`` (a server's or a page reader's fault): the rest of
    the prefix would never be listed, and every count would still add up.  A
    server that ignores ``encoding-type=url`` (no ``EncodingType`` in its answer)
    may write a character it cannot put in XML as U+FFFD (SeaweedFS does): that
    name's delete answers "deleted" while the object stays.
    """
    if response.get("IsTruncated") and not response.get("NextContinuationToken"):
        raise PermanentError(
            "truncated_listing",
            f"a ListObjectsV2 page under {prefix!r} says more keys follow "
            "(IsTruncated) but gives no NextContinuationToken to list them from, so "
            "the rest of the prefix cannot be listed; check the S3 endpoint and any "
            "proxy in front of it, then trigger the run again",
        )
    if response.get("EncodingType") != "url":
        contents = response.get("Contents", [])
        mangled = next((o["Key"] for o in contents if "\ufffd" in o.get("Key", "")), None)
        if mangled is not None:
            raise PermanentError(
                "listing_not_encoded",
                f"the server listed {prefix!r} without URL-encoding its keys, and "
                f"{mangled!r} holds U+FFFD where it could not write a character, so the "
                "key cannot be named for a delete; rename or delete that key by hand",
            )
    return response


def _close(state: ShardCursor, sub: str, subs: list[str]) -> None:
    """Mark ``sub`` finished and move ``through`` past every finished sub-prefix in order."""
    state.open.pop(sub, None)
    state.closed.append(sub)
    for candidate in subs:
        if candidate <= state.through:
            continue
        if candidate not in state.closed:
            break
        state.through = candidate
        state.closed.remove(candidate)
    state.closed.sort()


def _sequential(
    client: S3Client,
    bucket: str,
    prefix: str,
    start_after: str | None,
    page_size: int,
    stop: threading.Event | None,
    through: str | None = None,
) -> Iterator[tuple[Objects, str]]:
    """One listing in key order, up to and including ``through``; the cursor is the last key."""
    params: PageRequest = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
    if start_after:
        params["StartAfter"] = start_after
    for response in listed(client.get_paginator("list_objects_v2").paginate(**params), prefix):
        if stop is not None and stop.is_set():
            return
        contents = response.get("Contents", [])
        if through is not None and contents and contents[-1]["Key"] > through:
            contents = [o for o in contents if o["Key"] <= through]
            if contents:
                yield contents, contents[-1]["Key"]
            return
        if contents:
            yield contents, contents[-1]["Key"]


class _Lister:
    """Lists sub-prefixes on threads into one bounded queue of ``(sub-prefix, page)``."""

    def __init__(self, client: S3Client, bucket: str, page_size: int) -> None:
        self.client = client
        self.bucket = bucket
        self.page_size = page_size
        self.active: set[str] = set()
        self.out: queue.Queue[tuple[str, Objects | BaseException | _Done]] = queue.Queue(
            READ_AHEAD_PAGES
        )
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(LIST_SHARDS, thread_name_prefix="s3-list")

    def start(self, shard: str, prefix: str, start_after: str | None, through: str | None) -> None:
        self.active.add(shard)
        self.pool.submit(self._produce, shard, prefix, start_after, through)

    def next(self) -> tuple[str, Objects | _Done]:
        """The next page from any sub-prefix, or its end; a listing error is raised here."""
        sub, key = self.out.get()
        if key is _DONE:
            self.active.discard(sub)
        elif isinstance(key, BaseException):
            raise key
        return sub, key

    def _produce(
        self, shard: str, prefix: str, start_after: str | None, through: str | None
    ) -> None:
        try:
            for contents, _ in _sequential(
                self.client, self.bucket, prefix, start_after, self.page_size, self.stop, through
            ):
                if not self._put(shard, contents):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(shard, exc)
            return
        self._put(shard, _DONE)

    def _put(self, sub: str, key: Objects | BaseException | _Done) -> bool:
        """Queue ``key`` unless the listing was dropped; False once it was."""
        while not self.stop.is_set():
            try:
                self.out.put((sub, key), timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def __enter__(self) -> _Lister:
        return self

    def __exit__(self, *_: object) -> None:
        # A sweep slice that runs out of time drops the listing mid-way: stop the
        # producers instead of letting them list ahead for nobody.
        self.stop.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
