"""Kinds that exist only for tests, loaded by worker processes as ``tests.kinds:NAME``."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator, Sequence
from datetime import datetime

from digest_cleanup.kinds import KeyResult, Page, TargetKind


@dataclasses.dataclass(frozen=True)
class KillerOptions:
    count: int = 3


class KillerKind(TargetKind):
    """Lists ``count`` expired items, and kills its own process on every delete."""

    name = "killer"
    Options = KillerOptions

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        if start_after is None:
            keys = [f"doomed/{i}" for i in range(self.options.count)]
            yield Page(scanned=len(keys), expired=keys, cursor=keys[-1])

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        os.kill(os.getpid(), signal.SIGKILL)  # an OOM kill, as far as Celery can tell
        raise AssertionError("unreachable")

    def out_of_scope(self, key: str) -> str | None:
        return None if key.startswith("doomed/") else "not doomed"

    def describe(self) -> str:
        return "killer://"


class UnpreparableKind(KillerKind):
    """A kind whose client cannot be built, as with a missing credentials profile."""

    name = "unpreparable"

    def prepare(self) -> None:
        raise RuntimeError("the config profile (missing-profile) could not be found")


class BrokenKind(KillerKind):
    """Lists like :class:`KillerKind`, but its scope check raises on every batch.

    That is where a dropped PostgreSQL table surfaces (the key type lookup), before
    anything is deleted.
    """

    name = "broken"

    def out_of_scope(self, key: str) -> str | None:
        raise RuntimeError('relation "snapshots" does not exist')
