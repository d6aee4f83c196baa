"""The dead-letter index on a real Redis: nothing published is lost, folded or hidden."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from digest_cleanup.app import create_app
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.model.dead_letters import index_headers, make_entry
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.store.dead_letters import DeadLetterQueue


@pytest.fixture
def setup(redis_url: str) -> Iterator[tuple[Runtime, DeadLetterQueue, Any]]:
    settings = Settings(broker_url=redis_url)
    runtime = Runtime(settings)
    yield runtime, runtime.dead_letters, create_app(settings)
    runtime.close()


def _entry(run: str, keys: list[str]) -> dict[str, Any]:
    payload = BatchPayload(
        run_id=run,
        target="statements",
        batch_id=f"{run}-b00001",
        seq=1,
        cutoff="2026-10-25T03:00:00+00:00",
        keys=keys,
        scope="s",
    )
    dead = {k: KeyResult(k, Outcome.PERMANENT, "AccessDenied") for k in keys}
    return make_entry(payload, dead, "permanent_error").body


def _publish(app: Any, entry_id: str, kwargs: dict[str, Any], *, headers: bool = True) -> None:
    app.send_task(
        "digest_cleanup.delete_batch",
        kwargs=kwargs,
        task_id=entry_id,
        queue="dead_letter",
        headers=index_headers(kwargs) if headers else None,
    )


def test_a_copy_folds_and_the_same_id_with_other_keys_is_merged_into_it(setup):
    _, dlq, app = setup
    first = _entry("run-a", ["statements/k1.pdf", "statements/k2.pdf"])
    other = _entry("run-a", ["statements/k2.pdf", "statements/k3.pdf"])

    # When a message is delivered twice (another envelope, the same keys), and then one
    # with the same id but other keys, as a redelivery that failed differently sends
    _publish(app, "dl-x", first)
    _publish(app, "dl-x", first)
    _publish(app, "dl-x", other)

    # Then there is one entry, counted three times, holding every key once
    (entry,) = dlq.entries()
    assert entry.id == "dl-x"
    assert entry.copies == 3
    assert sorted(entry.keys) == ["statements/k1.pdf", "statements/k2.pdf", "statements/k3.pdf"]
    assert dlq.stats()[:2] == (1, 3)
    # and one redrive covers all of it
    assert dlq.redrive_one(entry)
    assert dlq.stats()[:2] == (0, 0)


def test_old_messages_without_headers_merge_the_same_way(setup):
    _, dlq, app = setup
    _publish(app, "dl-y", _entry("run-b", ["statements/a.pdf"]), headers=False)
    _publish(app, "dl-y", _entry("run-b", ["statements/b.pdf"]), headers=False)

    (entry,) = dlq.entries(run="run-b")
    assert sorted(entry.keys) == ["statements/a.pdf", "statements/b.pdf"]
    assert dlq.stats()[:2] == (1, 2)


def test_messages_without_index_headers_and_undecodable_ones_are_listed_too(setup):
    runtime, dlq, app = setup
    # Given an entry from an older release (no headers), then junk, then a current one
    _publish(app, "dl-old", _entry("run-old", ["statements/a.pdf"]), headers=False)
    runtime.redis.lpush("dead_letter", "not json at all")
    _publish(app, "dl-new", _entry("run-new", ["statements/b.pdf"]))

    # Then all three are listed, in arrival order, each filed under its run
    entries = dlq.entries()
    assert entries[0].id == "dl-old"
    assert entries[1].id.startswith("undecodable-")
    assert entries[2].id == "dl-new"
    assert [e.id for e in dlq.entries(run="run-old")] == ["dl-old"]
    assert [e.id for e in dlq.entries(run="run-new")] == ["dl-new"]
    assert runtime.redis.llen("dead_letter") == 0


def test_redrive_and_purge_take_one_entry_out_of_every_index(setup):
    runtime, dlq, app = setup
    for n in range(3):
        _publish(app, f"dl-{n}", _entry("run-a", [f"statements/k{n}.pdf"]))

    assert dlq.redrive_one(dlq.get("dl-0"))
    assert dlq.purge([dlq.get("dl-1")], "test")[0]["entry"]["id"] == "dl-1"

    assert [e.id for e in dlq.entries()] == ["dl-2"]
    assert [e.id for e in dlq.entries(run="run-a")] == ["dl-2"]
    assert dlq.stats()[:2] == (1, 1)
    moved = json.loads(runtime.redis.lindex("batches", 0))
    assert moved["headers"]["id"] == "dl-0"
    assert not dlq.redrive_one(dlq.get("dl-2")) or dlq.entries() == []


def test_an_entry_holding_no_keys_can_be_purged(setup):
    runtime, dlq, _ = setup
    # Given an undecodable message in the queue: an entry that holds no keys
    runtime.redis.lpush("dead_letter", "not json at all")
    (junk,) = dlq.entries()
    assert junk.id.startswith("undecodable-")

    # When an operator purges it, as its refusal to redrive tells them to
    purged = dlq.purge([junk], "test")

    # Then it is gone from every index, and the queue's key count has not moved
    assert [p["entry"]["id"] for p in purged] == [junk.id]
    assert dlq.entries() == []
    assert dlq.stats()[:2] == (0, 0)
