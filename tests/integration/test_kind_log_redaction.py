"""Keys of a kind without a ``prefix`` field are redacted in logs, as the kind declares.

Log redaction finds a target's keys by the leading parts its kind declares safe to
log (``TargetKind.log_prefixes``), by default its namespace's prefix.  Each kind
here logs every key it deletes, as a kind's own messages might, and neither has a
field called ``prefix``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from digest_cleanup.clock import utcnow
from digest_cleanup.kinds import KeyResult, Namespace, Outcome, Page, TargetKind
from digest_cleanup.logs import item_prefixes
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing.pipeline import PipelineResult

pytest_plugins = ["digest_cleanup.testing.plugin"]

logger = logging.getLogger(__name__)
_LOCK = threading.Lock()
#: Key -> last-modified time, for both kinds (their keys never collide).
KEYS: dict[str, datetime] = {}
CUSTOMERS = [f"cust-{i:04d}" for i in range(12)]


class _LoggingKind(TargetKind):
    """Keys in :data:`KEYS`; every delete is logged with its key."""

    max_batch_size = 100

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        with _LOCK:
            keys = sorted(k for k in KEYS if self.out_of_scope(k) is None)
        keys = [k for k in keys if start_after is None or k > start_after]
        if keys:
            yield Page(len(keys), [k for k in keys if KEYS[k] < cutoff], keys[-1])

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        with _LOCK:
            for key in keys:
                logger.warning("removing %s from %s", key, self.describe())
                KEYS.pop(key, None)
        return [KeyResult(k, Outcome.DELETED) for k in keys]


@dataclasses.dataclass(frozen=True)
class LedgerOptions:
    ledger: str


class LedgerKind(_LoggingKind):
    """Keys ``ledger:NAME:CUSTOMER``; it declares the part before the customer."""

    name = "ledger"
    Options = LedgerOptions
    options: LedgerOptions

    @classmethod
    def log_prefixes(cls, options: LedgerOptions) -> tuple[str, ...]:
        return (f"ledger:{options.ledger}:",)

    def out_of_scope(self, key: str) -> str | None:
        return None if key.startswith(f"ledger:{self.options.ledger}:") else "another ledger's"

    def describe(self) -> str:
        return f"ledger {self.options.ledger}"


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    root: str


class ExportKind(_LoggingKind):
    """Keys ``ROOT/DATE/CUSTOMER.csv``; only its namespace says where they start."""

    name = "export"
    Options = ExportOptions
    options: ExportOptions

    @classmethod
    def namespace(cls, options: ExportOptions) -> Namespace:
        return Namespace("export://", options.root, separator="/")

    def out_of_scope(self, key: str) -> str | None:
        return None if key.startswith(self.options.root + "/") else "outside the root"

    def describe(self) -> str:
        return f"export://{self.options.root}"


def _ledger_key(customer: str) -> str:
    return f"ledger:north:{customer}"


def _export_key(customer: str) -> str:
    return f"/exports/2026-11-22/{customer}.csv"


CASES = {
    "declared": (f"{__name__}:LedgerKind", 'ledger = "north"', _ledger_key, "ledger:north:h:"),
    "namespace": (f"{__name__}:ExportKind", 'root = "/exports"', _export_key, "/2026-11-22/h:"),
}


@pytest.fixture
def seeded() -> Iterator[Callable[[Callable[[str], str]], None]]:
    def seed(make_key: Callable[[str], str]) -> None:
        old = utcnow() - timedelta(days=30)
        with _LOCK:
            KEYS.update({make_key(c): old for c in CUSTOMERS})

    yield seed
    with _LOCK:
        KEYS.clear()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_logs_its_keys_without_their_customer_part(
    case: str, run_cleanup: Callable[..., PipelineResult], seeded: Any
) -> None:
    # Given a target of a kind with no prefix field, whose deletes log each key
    kind, field, make_key, redacted = CASES[case]
    seeded(make_key)
    targets = (
        f'[targets.t]\nkind = "{kind}"\n{field}\nretention_days = 7\n'
        f'schedule = "0 4 * * 0"\nbatch_size = 5\n'
    )

    # When it runs through the pipeline
    result = run_cleanup(targets)

    # Then every key was deleted and logged, and no line shows a customer id
    assert (result.run["status"], result.run["deleted"]) == ("complete", 12)
    removing = [line for line in result.logs if "removing " in line]
    assert len(removing) == 12
    assert all(redacted in line for line in removing), removing[:3]
    leaked = [line for line in result.logs if any(c in line for c in CUSTOMERS)]
    assert not leaked, leaked[:3]
    # and the worker's own scrubber is built from the same declaration
    assert item_prefixes(parse_targets(targets)) in (["ledger:north:"], ["/exports"])
