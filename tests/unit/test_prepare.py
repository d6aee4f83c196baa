"""A worker process builds its targets' clients when it starts, not on its first task."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from celery.concurrency import prefork, thread

from digest_cleanup.app import _prepare_in_main_process
from digest_cleanup.kinds import s3
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.targets import load_targets

TARGETS = """
[targets.statements]
bucket = "digest-artifacts"
prefix = "statements/"
retention_days = 30
schedule = "0 3 * * 0"

[targets.receipts]
bucket = "digest-artifacts"
prefix = "receipts/"
retention_days = 30
schedule = "0 3 * * 0"
"""

BROKEN = """
[targets.broken]
kind = "tests.kinds:UnpreparableKind"
retention_days = 1
schedule = "0 3 * * 0"
"""


@pytest.fixture
def clients_made(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    made: list[Settings] = []
    real = s3.make_client

    def counting(settings: Settings, **kwargs: Any) -> Any:
        made.append(settings)
        return real(settings, **kwargs)

    monkeypatch.setattr(s3, "make_client", counting)
    return made


def _runtime(tmp_path: Path, text: str) -> Runtime:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    # Port 9 (discard) is closed here: building a client must send nothing.
    settings = Settings(s3_endpoint_url="http://127.0.0.1:9", targets_file=path)
    return Runtime(settings, load_targets(path))


def test_prepare_builds_every_target_client_once_and_tasks_reuse_it(tmp_path, clients_made):
    runtime = _runtime(tmp_path, TARGETS)
    runtime.prepare()
    assert len(clients_made) == 2
    first = runtime.kind("statements").client  # type: ignore[attr-defined]
    assert runtime.kind("statements").client is first  # type: ignore[attr-defined]
    runtime.prepare()  # a second signal (solo pool) builds nothing more
    assert len(clients_made) == 2


def test_a_target_that_cannot_be_prepared_is_logged_and_the_others_still_are(
    tmp_path, clients_made, caplog
):
    runtime = _runtime(tmp_path, TARGETS + BROKEN)
    with caplog.at_level(logging.WARNING, logger="digest_cleanup.runtime"):
        runtime.prepare()
    assert len(clients_made) == 2
    [record] = caplog.records
    assert "target broken" in record.getMessage()
    assert "missing-profile" in record.getMessage()


def test_after_fork_drops_inherited_clients_and_builds_fresh_ones(tmp_path, clients_made):
    runtime = _runtime(tmp_path, TARGETS)
    runtime.prepare()
    inherited = runtime.kind("statements").client  # type: ignore[attr-defined]
    runtime.after_fork()
    runtime.prepare()
    assert len(clients_made) == 4
    assert runtime.kind("statements").client is not inherited  # type: ignore[attr-defined]


class _Recorder:
    def __init__(self) -> None:
        self.prepared = 0

    def prepare(self) -> None:
        self.prepared += 1


class _Consumer:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.app = type("App", (), {"digest_cleanup_runtime": _Recorder()})()


@pytest.mark.parametrize(
    ("pool", "prepared"),
    [(thread.TaskPool(limit=1), 1), (prefork.TaskPool(limit=1), 0)],
    ids=["threads pool: tasks run in the main process", "prefork: its children prepare"],
)
def test_worker_ready_prepares_the_main_process_only_when_it_runs_tasks(pool, prepared):
    consumer = _Consumer(pool)
    _prepare_in_main_process(sender=consumer)
    assert consumer.app.digest_cleanup_runtime.prepared == prepared
