"""The series the skip and dead-letter alerts read: failing keys by code, and each run's
skip allowance, exported from a real run store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from digest_cleanup.model.batches import BatchRecord
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.unit.test_metrics import scrape, value

TARGETS = """
[targets.statements]
bucket = "digests"
prefix = "statements/"
retention_days = 30
schedule = "0 3 * * 0"

[targets.receipts]
bucket = "digests"
prefix = "receipts/"
retention_days = 30
schedule = "0 3 * * 0"
max_skipped_share = 0.3
"""


@pytest.fixture
def runtime(redis_url: str, tmp_path: Path) -> Runtime:
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS)
    return Runtime(Settings(broker_url=redis_url, targets_file=path))


def _open(runtime: Runtime, run_id: str, target: str, **fields: Any) -> None:
    base = {"target": target, "cutoff": "2026-10-23T03:00:00+00:00", "batch_size": 500}
    assert runtime.store.runs.open(run_id, base | fields) == "created"


def _record(runtime: Runtime, run_id: str, target: str, seq: int, **kw: Any) -> None:
    batch = f"{run_id}-b{seq:05d}"
    rec = BatchRecord(batch_id=batch, claim=f"{batch}/g0/a0", terminal=False, **kw)
    assert runtime.store.runs.record(run_id, target, rec) == "recorded"


def test_failing_keys_are_exported_by_code_and_each_run_by_its_skip_allowance(runtime):
    # Given a run that dead-lettered 20 keys as condition_mismatch and retried 5 SlowDowns,
    # opened with a skip allowance of a quarter, and a target with no run yet
    run = "statements-20261023T030000Z"
    _open(runtime, run, "statements", max_skipped_share="0.25")
    _record(runtime, run, "statements", 1, deleted=480, dead_lettered=20,
            codes={"condition_mismatch": 20})  # fmt: skip
    _record(runtime, run, "statements", 2, retries=1, codes={"SlowDown": 5},
            retried_codes=["SlowDown"])  # fmt: skip

    # When it is scraped
    samples = scrape(runtime)

    # Then the failures are there by code, for the alert on condition_mismatch
    failures = "digest_cleanup_key_failures_total"
    assert value(samples, failures, target="statements", code="condition_mismatch") == 20
    assert value(samples, failures, target="statements", code="SlowDown") == 5
    # and the allowance is the run's own, or the configured one of a target with no run
    share = "digest_cleanup_max_skipped_share"
    assert value(samples, share, target="statements") == 0.25
    assert value(samples, share, target="receipts") == 0.3


def test_a_run_opened_without_an_allowance_exports_the_default(runtime):
    run = "statements-20261023T030000Z"
    _open(runtime, run, "statements")

    samples = scrape(runtime)

    assert value(samples, "digest_cleanup_max_skipped_share", target="statements") == 0.1
