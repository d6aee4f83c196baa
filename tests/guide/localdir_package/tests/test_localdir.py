"""The local directory kind through the real pipeline, with only the shipped plugin's fixtures."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from digest_cleanup.clock import utcnow
from digest_cleanup.kinds import Outcome
from digest_cleanup.targets import parse_targets

pytest_plugins = ["digest_cleanup.testing.plugin"]

TARGETS = """
[targets.digests]
kind = "localdir"
directory = "{directory}"
retention_days = 7
schedule = "0 4 * * 0"
batch_size = 10
"""
OLD = (utcnow() - timedelta(days=30)).timestamp()


def seed(root: Path, names: list[str], mtime: float | None = None) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"digest")
        if mtime is not None:
            os.utime(path, (mtime, mtime))


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_expired_files_go_and_files_changed_after_the_sweep_stay(run_cleanup, tmp_path):
    # Given 25 files older than the retention and 5 newer ones
    root = tmp_path / "digests"
    old = [f"2026-11-{d:02d}/cust-{i:06d}.pdf" for d in (1, 8) for i in range(d, d + 12)]
    old.append("2026-11-15/cust-000099.pdf")
    new = [f"2026-12-01/cust-{i:06d}.pdf" for i in range(5)]
    seed(root, old, mtime=OLD)
    seed(root, new)
    rewritten, touched = old[3], old[20]
    seen: dict[str, Any] = {}

    def change_two_listed_files(run: dict[str, Any]) -> None:
        # The sweep has published every batch, and none has run
        seen.update(run)
        assert files(root) == set(old) | set(new)
        # One is rewritten and dated back (only its fingerprint changed), one is touched
        (root / rewritten).write_bytes(b"re-rendered digest")
        os.utime(root / rewritten, (OLD, OLD))
        os.utime(root / touched)

    # When the target runs with a change between the sweep and its batches
    result = run_cleanup(TARGETS.format(directory=root), between=change_two_listed_files)

    # Then both changed files are kept as changed since listing, the other expired ones go
    assert (seen["expired"], seen["batches"], seen["deleted"]) == (25, 3, 0)
    run = result.run
    assert run["status"] == "complete"
    assert (run["expired"], run["deleted"], run["skipped"], run["dead_lettered"]) == (25, 23, 2, 0)
    assert files(root) == set(new) | {rewritten, touched}
    # and the kind's log lines name the directory and date, never the customer
    kept = [line for line in result.logs if "kept " in line]
    assert len(kept) == 2
    assert all(f"{root}/2026-11-" in line and "/h:" in line for line in kept)
    assert not [line for line in result.logs if "cust-0000" in line]


def test_a_file_moved_aside_by_another_attempt_is_retried_not_counted(tmp_path):
    # Given a listed file that another attempt of the same batch has moved aside
    root = tmp_path / "digests"
    seed(root, ["a/cust-1.pdf"], mtime=OLD)
    target = parse_targets(TARGETS.format(directory=root)).get("digests")
    kind = target.make_kind(_settings())
    cutoff = target.cutoff_for(utcnow())
    (page,) = kind.scan(cutoff)
    (root / "a/cust-1.pdf").rename(root / "a/.cust-1.pdf.deleting-other")

    # When this attempt deletes it
    (result,) = kind.delete(page.expired, cutoff, page.conditions)

    # Then it waits for the other attempt's outcome instead of claiming a delete
    assert (result.outcome, result.code) == (Outcome.TRANSIENT, "delete_in_progress")
    assert [f.status for f in kind.check()] == ["warning"]
    assert kind.out_of_scope(str(root / "a/.cust-1.pdf.deleting-other")) is not None
    assert kind.out_of_scope(str(root) + "-old/x.pdf") is not None
    assert kind.condition_problem("*") is not None


def _settings() -> Any:
    from digest_cleanup.settings import Settings

    return Settings()
