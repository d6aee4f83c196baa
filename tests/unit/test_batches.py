"""Batch messages and the retry decision, as plain logic."""

from __future__ import annotations

import json

import pytest

from digest_cleanup.errors import PoisonMessage
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.model.batches import BatchPayload, backoff, decide
from digest_cleanup.settings import Settings

KEYS = [f"statements/2026-11-22/cust-{i:07d}.pdf" for i in range(500)]


def payload(**kw):
    base = {
        "run_id": "statements-20261122T030000Z",
        "target": "statements",
        "batch_id": "statements-20261122T030000Z-b00017",
        "seq": 17,
        "cutoff": "2026-10-23T03:00:00+00:00",
        "keys": KEYS,
    }
    return BatchPayload(**(base | kw))


def test_message_round_trips_and_folds_the_common_prefix():
    message = payload().to_message()
    assert message["base"] == "statements/2026-11-22/cust-0000"
    assert BatchPayload.from_message(json.loads(json.dumps(message))) == payload()
    plain = len(json.dumps(KEYS))
    assert len(json.dumps(message)) < plain * 0.5


def test_message_carries_failures_and_dead_letter_as_copies():
    original = payload(
        attempt=2,
        failures={KEYS[0]: ["SlowDown", "reduce your request rate"]},
        first_failure_at="2026-11-22T03:00:05+00:00",
        dead_letter={
            "reason": "retries_exhausted",
            "entry_id": "dl-1",
            "errors": {KEYS[0]: ["SlowDown", "reduce your request rate"]},
        },
    )
    message = original.to_message()
    assert BatchPayload.from_message(json.loads(json.dumps(message))) == original
    message["failures"][KEYS[0]].append("edited")
    message["dead_letter"]["reason"] = "edited"
    message["dead_letter"]["errors"][KEYS[0]].append("edited")
    assert original.failures == {KEYS[0]: ["SlowDown", "reduce your request rate"]}
    assert original.dead_letter["reason"] == "retries_exhausted"
    assert original.dead_letter["errors"] == {KEYS[0]: ["SlowDown", "reduce your request rate"]}


def test_label_names_the_batch_but_no_key():
    label = payload().describe()
    assert label == "statements 2026-10-23 batch 17 (500 keys)"
    assert "cust" not in label


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("a string", "malformed"),
        ({"run_id": "r"}, "malformed"),
        (payload().to_message() | {"rest": [1, 2]}, "malformed"),
        (payload().to_message() | {"cutoff": "tuesday"}, "malformed"),
        (payload().to_message() | {"evil": True}, "malformed"),
        (payload().to_message() | {"rest": ["k"] * 1001}, "too_many_keys"),
    ],
)
def test_poison_messages_are_recognised(raw, code):
    with pytest.raises(PoisonMessage) as err:
        BatchPayload.from_message(raw)
    assert err.value.code == code


def test_decide_sorts_outcomes_and_stops_retrying_at_the_limit():
    results = [
        KeyResult("a", Outcome.DELETED),
        KeyResult("b", Outcome.SKIPPED, "not_expired"),
        KeyResult("c", Outcome.TRANSIENT, "SlowDown", retry_after=3.0),
        KeyResult("d", Outcome.PERMANENT, "AccessDenied"),
    ]
    first = decide(results, attempt=0, max_retries=2)
    assert (first.deleted, first.skipped, sorted(first.retry), sorted(first.dead)) == (
        1,
        1,
        ["c"],
        ["d"],
    )
    assert first.retry_after == 3.0
    assert first.codes() == {"SlowDown": 1, "AccessDenied": 1}
    last = decide(results, attempt=2, max_retries=2)
    assert sorted(last.dead) == ["c", "d"]
    assert not last.retry


def test_backoff_has_full_jitter_honours_retry_after_and_stays_inside_the_visibility_timeout():
    settings = Settings(visibility_timeout=20, retry_base=1.0, retry_cap=60.0)
    delays = [backoff(3, settings) for _ in range(200)]
    assert 0 <= min(delays) < 2
    assert max(delays) <= 8
    assert len({round(d, 3) for d in delays}) > 100
    assert backoff(0, settings, retry_after=4.0) >= 4.0
    # far attempts and long Retry-After are clamped to half the visibility timeout
    assert max(backoff(30, settings) for _ in range(100)) <= 10
    assert backoff(0, settings, retry_after=600) == 10
