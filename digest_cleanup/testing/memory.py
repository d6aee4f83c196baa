"""An in-memory target kind, the seam's test double.

Keys live in a process-wide dict, keyed by store name, so a test can seed them,
run the real sweep -> batch -> dead-letter path in-process, and inspect what
is left.  Faults are scripted per key: a transient error for the first N
attempts, or a permanent error for ever.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

from digest_cleanup.kinds import CHANGED_SINCE_LISTING, KeyResult, Outcome, Page, TargetKind

_LOCK = threading.Lock()
#: store name -> key -> last-modified time.
STORES: dict[str, dict[str, datetime]] = {}
#: store name -> key -> [outcome, code, remaining times (-1 = for ever)].
FAULTS: dict[str, dict[str, list[Any]]] = {}
#: store name -> how many times each key was in a delete call.
DELETE_CALLS: dict[str, dict[str, int]] = {}


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """Fields of a memory target."""

    store: str
    prefix: str = ""
    page_size: int = 100


class MemoryKind(TargetKind):
    """Keys in a dict, expired by their timestamp."""

    name = "memory"
    Options = MemoryOptions
    max_batch_size: ClassVar[int] = 1000
    #: A scripted ``SlowDown`` is a throttle, as S3's is.
    throttle_codes: ClassVar[frozenset[str]] = frozenset({"SlowDown"})

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        with _LOCK:
            keys = sorted(
                (k, t)
                for k, t in STORES.get(self.options.store, {}).items()
                if k.startswith(self.options.prefix) and (start_after is None or k > start_after)
            )
        size = self.options.page_size
        for i in range(0, len(keys), size):
            page = keys[i : i + size]
            yield Page(
                scanned=len(page), expired=[k for k, t in page if t < cutoff], cursor=page[-1][0]
            )

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        results = []
        with _LOCK:
            store = STORES.setdefault(self.options.store, {})
            faults = FAULTS.get(self.options.store, {})
            calls = DELETE_CALLS.setdefault(self.options.store, {})
            for key in keys:
                calls[key] = calls.get(key, 0) + 1
                fault = faults.get(key)
                if fault and fault[2] != 0:
                    fault[2] -= 1 if fault[2] > 0 else 0
                    results.append(KeyResult(key, fault[0], fault[1], f"scripted {fault[1]}"))
                    continue
                stamp = store.get(key)
                if stamp is not None and stamp >= cutoff:
                    results.append(KeyResult(key, Outcome.SKIPPED, CHANGED_SINCE_LISTING))
                    continue
                store.pop(key, None)
                results.append(KeyResult(key, Outcome.DELETED))
        return results

    @classmethod
    def log_prefixes(cls, options: MemoryOptions) -> tuple[str, ...]:
        """Its keys start with the target's ``prefix``: logs show that much of them."""
        return (options.prefix,) if options.prefix else ()

    def out_of_scope(self, key: str) -> str | None:
        if not key.startswith(self.options.prefix):
            return f"outside the target prefix {self.options.prefix!r}"
        return None

    def describe(self) -> str:
        return f"memory://{self.options.store}/{self.options.prefix}"


def seed(store: str, keys: dict[str, datetime]) -> None:
    """Add keys with their last-modified times."""
    with _LOCK:
        STORES.setdefault(store, {}).update(keys)


def fail(store: str, key: str, outcome: Outcome, code: str, times: int = -1) -> None:
    """Make deletes of ``key`` fail with ``code`` for ``times`` attempts (-1: always)."""
    with _LOCK:
        FAULTS.setdefault(store, {})[key] = [outcome, code, times]


def contents(store: str) -> dict[str, datetime]:
    with _LOCK:
        return dict(STORES.get(store, {}))


def reset(store: str) -> None:
    with _LOCK:
        STORES.pop(store, None)
        FAULTS.pop(store, None)
        DELETE_CALLS.pop(store, None)
