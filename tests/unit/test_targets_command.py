"""``digest-cleanup targets`` describes every kind of target, and no DSN password leaks."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from digest_cleanup.cli import main
from digest_cleanup.logs import install
from digest_cleanup.settings import Settings

TARGETS = """
[targets.statements]
bucket = "digest-artifacts"
prefix = "statements/"
retention_days = 30
schedule = "0 3 * * 0"

[targets.snapshots]
kind = "postgres"
table = "public.snapshots"
primary_key = "id"
timestamp_column = "updated_at"
dsn_env = "SNAPSHOTS_DSN"
retention_days = 14
schedule = "30 3 * * 0"
batch_size = 1000
max_delete = 100000
"""
PASSWORD = "correct-horse-battery"
DSN = f"postgresql://cleaner:{PASSWORD}@db.internal:5432/digest"


@pytest.fixture
def targets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS)
    monkeypatch.setenv("CLEANUP_TARGETS_FILE", str(path))
    monkeypatch.delenv("CLEANUP_S3_ENDPOINT_URL", raising=False)  # AWS S3, and its budget
    return path


def test_targets_lists_kind_schedule_retention_and_guard_without_the_dsn(
    targets_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a postgres target whose DSN holds a password
    monkeypatch.setenv("SNAPSHOTS_DSN", DSN)

    # When the targets are listed as JSON and as text
    assert main(["targets", "--json"]) == 0
    as_json = capsys.readouterr().out
    assert main(["targets"]) == 0
    as_text = capsys.readouterr().out

    # Then each target shows its kind, location, schedule, retention, max_delete and budget
    rows = {row["name"]: row for row in json.loads(as_json)["targets"]}
    assert {k: rows["snapshots"][k] for k in ("kind", "location", "schedule")} == {
        "kind": "postgres",
        "location": "postgres://public.snapshots",
        "schedule": "30 3 * * 0",
    }
    assert (rows["snapshots"]["retention_days"], rows["snapshots"]["max_delete"]) == (14, 100000)
    assert rows["statements"]["location"] == "s3://digest-artifacts/statements/"
    assert rows["statements"]["max_delete"] == 250_000
    snapshots_line = next(line for line in as_text.splitlines() if line.startswith("snapshots"))
    assert snapshots_line.split() == [
        "snapshots", "postgres", "postgres://public.snapshots",
        "30", "3", "*", "*", "0", "14", "1000", "100000", "none",
    ]  # fmt: skip
    # and the delete budget: AWS S3's default for the bucket, none for the table
    assert (rows["statements"]["delete_rate"], rows["snapshots"]["delete_rate"]) == (3300, 0)
    assert "3,300/s" in next(line for line in as_text.splitlines() if line.startswith("statem"))
    # and neither output shows the DSN or its password
    for output in (as_json, as_text):
        assert PASSWORD not in output
        assert "db.internal" not in output


def test_a_target_whose_dsn_is_not_set_here_is_still_listed_with_the_reason(
    targets_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a shell without the DSN variable (it is set for the workers only)
    monkeypatch.delenv("SNAPSHOTS_DSN", raising=False)

    # When the targets are listed
    assert main(["targets", "--json"]) == 0

    # Then both targets are there, and the postgres one says which variable is missing
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["targets"]}
    assert set(rows) == {"statements", "snapshots"}
    assert rows["snapshots"]["location"] is None
    assert rows["snapshots"]["problem"].startswith("SNAPSHOTS_DSN: is not set")
    assert "problem" not in rows["statements"]


@pytest.mark.parametrize(
    "dsn",
    [
        DSN,
        f"host=db.internal dbname=digest user=cleaner password={PASSWORD}",
        f"host=db.internal user=cleaner password='{PASSWORD}'",
        f"postgresql://db.internal/digest?user=cleaner&password={PASSWORD}",
    ],
)
def test_dsn_passwords_are_masked_in_logs_whatever_variable_holds_them(dsn: str) -> None:
    # Given settings whose environment holds a DSN under a name only a target knows
    settings = Settings.from_env({"SNAPSHOTS_DSN": dsn})
    assert PASSWORD in settings.secrets()
    stream = io.StringIO()
    logger = logging.getLogger(f"test.masking.{id(dsn)}")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(stream))
    install(logger, settings)

    # When a line quotes the DSN (say, a driver's error message)
    logger.error("could not connect with %s", dsn)

    # Then the password is masked
    assert PASSWORD not in stream.getvalue()
    assert "***" in stream.getvalue()


def test_a_percent_encoded_password_is_masked_in_both_forms() -> None:
    settings = Settings.from_env({"SNAPSHOTS_DSN": "postgresql://u:p%40ss%2Fword@db/x"})
    assert {"p%40ss%2Fword", "p@ss/word"} <= set(settings.secrets())
