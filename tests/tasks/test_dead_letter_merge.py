"""Merging dead letters on a real Redis: entries with ETags, and one bad entry among many."""

from __future__ import annotations

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


def _attempt(keys: list[str]) -> BatchPayload:
    """One attempt at a batch whose keys each carry their listed ETag."""
    return BatchPayload(
        run_id="run-e",
        target="statements",
        batch_id="run-e-b00001",
        seq=1,
        cutoff="2026-10-25T03:00:00+00:00",
        keys=keys,
        conditions=[f'"etag-{k.rsplit("/", 1)[-1]}"' for k in keys],
        scope="s",
    )


def _dead(payload: BatchPayload, keys: list[str], code: str) -> dict[str, Any]:
    """The dead-letter body of ``keys`` of ``payload``, failed with ``code``."""
    return make_entry(
        payload, {k: KeyResult(k, Outcome.PERMANENT, code) for k in keys}, "permanent_error"
    ).body


def _publish(app: Any, entry_id: str, kwargs: dict[str, Any], *, headers: bool = True) -> None:
    app.send_task(
        "digest_cleanup.delete_batch",
        kwargs=kwargs,
        task_id=entry_id,
        queue="dead_letter",
        headers=index_headers(kwargs) if headers else None,
    )


@pytest.mark.parametrize("headers", [True, False], ids=["indexed", "old-format"])
def test_a_redelivery_that_dead_letters_other_keys_merges_with_their_etags(setup, headers):
    _, dlq, app = setup
    # Given one attempt at a batch with ETags, delivered twice, whose deliveries failed
    # different keys (the second after a redelivery), as the same entry id
    attempt = _attempt(["statements/k1.pdf", "statements/k2.pdf", "statements/k3.pdf"])
    entry_id = "dl-run-e-b00001-g0a0"
    _publish(app, entry_id, _dead(attempt, ["statements/k1.pdf"], "AccessDenied"), headers=headers)
    _publish(
        app,
        entry_id,
        _dead(attempt, ["statements/k2.pdf", "statements/k3.pdf"], "InvalidObjectState"),
        headers=headers,
    )

    # When the queue is read
    (entry,) = dlq.entries()

    # Then the one entry holds every key once, each with its own listed ETag
    assert entry.payload is not None
    conditions = dict(zip(entry.payload.keys, entry.payload.conditions, strict=True))
    assert conditions == {
        "statements/k1.pdf": '"etag-k1.pdf"',
        "statements/k2.pdf": '"etag-k2.pdf"',
        "statements/k3.pdf": '"etag-k3.pdf"',
    }
    assert entry.copies == 2
    assert {k["key"]: k["code"] for k in entry.as_dict()["keys"]} == {
        "statements/k1.pdf": "AccessDenied",
        "statements/k2.pdf": "InvalidObjectState",
        "statements/k3.pdf": "InvalidObjectState",
    }
    assert dlq.stats()[:2] == (1, 3)
    # and every later read still works, and one redrive covers the whole batch
    assert dlq.depth() == 1
    assert dlq.redrive_one(dlq.get(entry_id))
    assert dlq.stats()[:2] == (0, 0)


def test_one_entry_that_cannot_be_merged_is_kept_apart_and_reads_go_on(setup):
    runtime, dlq, app = setup
    # Given an entry, then a message with its id whose body is not a batch at all
    good = _dead(_attempt(["statements/a.pdf"]), ["statements/a.pdf"], "AccessDenied")
    _publish(app, "dl-z", good)
    junk = {"run_id": "run-e", "base": "statements/", "rest": ["b.pdf"], "dead_letter": "junk"}
    _publish(app, "dl-z", junk, headers=False)
    # and another ordinary entry behind it
    _publish(app, "dl-after", _dead(_attempt(["statements/c.pdf"]), ["statements/c.pdf"], "X"))

    # When the queue is read, twice
    first = dlq.entries()
    again = dlq.entries()

    # Then nothing is lost: the original, the odd one kept as its own entry, and the next
    assert [e.id for e in first] == [e.id for e in again]
    ids = [e.id for e in first]
    assert len(ids) == 3
    assert ids[0] == "dl-z"
    assert ids[1].startswith("dl-z~")
    assert ids[2] == "dl-after"
    assert first[0].keys == ["statements/a.pdf"]
    assert runtime.redis.llen("dead_letter") == 0
    # (the odd one holds no keys it could delete)
    assert dlq.stats()[:2] == (3, 2)
    assert first[1].payload is None


def test_an_indexed_entry_that_no_longer_decodes_does_not_break_listing(setup):
    runtime, dlq, app = setup
    # Given two entries, one of which was damaged in the index
    _publish(app, "dl-1", _dead(_attempt(["statements/a.pdf"]), ["statements/a.pdf"], "X"))
    _publish(app, "dl-2", _dead(_attempt(["statements/b.pdf"]), ["statements/b.pdf"], "X"))
    dlq.absorb()
    runtime.redis.hset(
        f"{dlq.key_prefix}:dlq:entries",
        "dl-1",
        '{"body": "W10=", "properties": "x", "headers": {"id": "dl-1"}}',
    )

    # When the queue is listed
    entries = dlq.entries()

    # Then both are listed: the damaged one as not redrivable, under its own id
    assert [e.id for e in entries] == ["dl-1", "dl-2"]
    assert entries[0].payload is None
    assert entries[0].as_dict()["reason"] == "undecodable"
    assert entries[1].payload is not None


@pytest.mark.parametrize(
    "headers",
    [
        {"dc_run": "run-e", "dc_target": "statements", "dc_keys": "many", "dc_digest": "x"},
        {"dc_run": ["run-e"], "dc_target": "statements", "dc_keys": 1, "dc_digest": "x"},
    ],
    ids=["keys-not-a-number", "run-not-a-string"],
)
def test_a_message_with_forged_index_headers_is_filed_without_them(setup, headers):
    runtime, dlq, app = setup
    # Given a message whose index headers are not what a worker writes, then a real one
    body = _dead(_attempt(["statements/a.pdf"]), ["statements/a.pdf"], "X")
    app.send_task(
        "digest_cleanup.delete_batch", kwargs=body, task_id="dl-forged", queue="dead_letter",
        headers=headers,
    )  # fmt: skip
    _publish(app, "dl-next", _dead(_attempt(["statements/b.pdf"]), ["statements/b.pdf"], "X"))

    # When the queue is read, then both are listed, each under its own run and keys
    assert [e.id for e in dlq.entries()] == ["dl-forged", "dl-next"]
    assert [e.id for e in dlq.entries(run="run-e")] == ["dl-forged", "dl-next"]
    assert dlq.stats()[:2] == (2, 2)
    assert runtime.redis.llen("dead_letter") == 0


def test_a_message_that_is_not_even_text_is_listed_as_undecodable(setup):
    runtime, dlq, app = setup
    # Given bytes that are not UTF-8 on the queue, then a real entry
    runtime.redis.lpush("dead_letter", b"\xff\xfe\x00 not text")
    _publish(app, "dl-next", _dead(_attempt(["statements/b.pdf"]), ["statements/b.pdf"], "X"))

    # When the queue is read, then both are listed
    entries = dlq.entries()
    assert entries[0].id.startswith("undecodable-")
    assert entries[1].id == "dl-next"
    assert runtime.redis.llen("dead_letter") == 0
