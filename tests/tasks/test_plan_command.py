"""``digest-cleanup plan`` reads the service times batch attempts recorded in the run store."""

from __future__ import annotations

import json

import pytest

from digest_cleanup.cli import main
from digest_cleanup.model.batches import BatchRecord
from digest_cleanup.store.runs import RunStore

TARGETS = """
[targets.statements]
bucket = "digests"
prefix = "statements/"
retention_days = 35
schedule = "0 3 * * 0"
batch_size = 500
"""


@pytest.fixture
def configured(redis_url, tmp_path, monkeypatch):
    targets = tmp_path / "targets.toml"
    targets.write_text(TARGETS)
    monkeypatch.setenv("CLEANUP_BROKER_URL", redis_url)
    monkeypatch.setenv("CLEANUP_TARGETS_FILE", str(targets))
    monkeypatch.setenv("CLEANUP_VISIBILITY_TIMEOUT", "300")
    return redis_url


def record_attempts(redis_client, count: int, seconds: float, delete_seconds: float) -> None:
    """Record ``count`` batch attempts of 500 items the way a worker does."""
    store = RunStore(redis_client)
    store.runs.open("statements-run", {"target": "statements"})
    for i in range(count):
        store.runs.record(
            "statements-run",
            "statements",
            BatchRecord(
                batch_id=f"b{i}",
                claim=f"b{i}/g0/a0",
                deleted=500,
                service_seconds=seconds,
                delete_seconds=delete_seconds,
                keys=500,
            ),
        )


def test_without_measurements_it_says_to_run_a_cleanup_first(configured, capsys):
    code = main(["plan", "--artifacts", "120000", "--window", "1h"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "run a cleanup first" in err


def test_a_plan_from_recorded_attempts(configured, redis_client, capsys):
    # Given 200 recorded batches of 500 items, 0.6 s each (0.55 s in the delete call)
    record_attempts(redis_client, 200, 0.6, 0.55)

    # When 120,000 artifacts are planned for one minute at 60% utilization
    code = main(["plan", "--artifacts", "120000", "--window", "1m", "--json"])

    # Then 4 batches/s x 0.6 s / 0.6 = 4 slots, in one worker, with no warning
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["targets"] == ["statements"]
    assert plan["batch_size"] == 500
    assert plan["service"]["attempts"] == 200
    assert plan["batches_per_second"] == pytest.approx(4.0)
    assert plan["consumers_exact"] == pytest.approx(4.0)
    assert (plan["consumers"], plan["workers"], plan["concurrency"]) == (4, 1, 4)
    assert plan["service"]["overhead_median"] == pytest.approx(0.05)
    assert plan["warnings"] == []


def test_the_text_plan_shows_the_formula_and_the_warnings(configured, redis_client, capsys):
    # Given slow batches: 90 s each, close to a 300 s visibility timeout
    record_attempts(redis_client, 10, 90.0, 89.0)

    code = main(["plan", "--artifacts", "1200000", "--window", "5m", "--target", "statements"])

    out = capsys.readouterr().out
    assert code == 0
    assert "/ 0.6 utilization" in out
    assert "delete slots" in out
    assert "visibility timeout" in out
    # 4,000 deletes/s is past the budget an AWS S3 target has by default
    assert "past the delete budget of 3,300 keys/s (delete_rate)" in out
    assert "1,200,000 keys take at least 6m3s plus one listing" in out


def test_an_unknown_target_is_a_one_line_error(configured, capsys):
    code = main(["plan", "--artifacts", "10", "--window", "1h", "--target", "receipts"])
    assert code == 2
    assert "unknown target 'receipts'" in capsys.readouterr().err
