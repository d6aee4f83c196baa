"""``run_pipeline(between=...)`` runs test code after the sweep and before any batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from digest_cleanup.clock import utcnow
from digest_cleanup.testing import memory
from digest_cleanup.testing.pipeline import PipelineResult

pytest_plugins = ["digest_cleanup.testing.plugin"]

STORE = "between"
TARGETS = f"""
[targets.mem]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "{STORE}"
prefix = "digests/"
retention_days = 7
schedule = "0 4 * * 0"
batch_size = 4
"""


@pytest.fixture
def store() -> Iterator[str]:
    memory.reset(STORE)
    yield STORE
    memory.reset(STORE)


def test_between_sees_every_batch_published_and_none_run(
    run_cleanup: Callable[..., PipelineResult], store: str
) -> None:
    # Given ten expired keys, in three batches
    old = utcnow() - timedelta(days=30)
    memory.seed(store, {f"digests/{i:02d}": old for i in range(10)})
    seen: list[tuple[dict[str, Any], int]] = []

    def rewrite_one(run: dict[str, Any]) -> None:
        seen.append((run, len(memory.contents(store))))
        memory.seed(store, {"digests/03": utcnow()})  # rewritten since the listing

    # When the run goes with a rewrite between its sweep and its batches
    result = run_cleanup(TARGETS, between=rewrite_one)

    # Then the hook ran once, with the sweep done and nothing deleted yet
    ((run, present),) = seen
    assert (run["sweep_done"], run["batches"], run["batches_done"], present) == (True, 3, 0, 10)
    # and the batches that ran afterwards kept the rewritten key
    assert result.run["status"] == "complete"
    assert (result.run["deleted"], result.run["skipped"]) == (9, 1)
    assert set(memory.contents(store)) == {"digests/03"}
