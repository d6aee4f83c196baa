"""The label Flower and the worker log show for a batch: short, honest about the total."""

from __future__ import annotations

from digest_cleanup.model.batches import BatchPayload, batch_total

KEYS = [f"statements/2026-11-22/cust-{i:07d}.pdf" for i in range(500)]


def payload(**kw: object) -> BatchPayload:
    base: dict[str, object] = {
        "run_id": "statements-20261023T030000Z",
        "target": "statements",
        "batch_id": "statements-20261023T030000Z-b00017",
        "seq": 17,
        "cutoff": "2026-10-23T03:00:00+00:00",
        "keys": KEYS,
    }
    return BatchPayload(**(base | kw))  # type: ignore[arg-type]


def test_the_total_is_exact_after_the_sweep_and_an_estimate_while_it_streams():
    done = {"sweep_done": "1", "batches": "240", "expired_seen": "119800", "batch_size": "500"}
    assert batch_total(done, 17) == "240"
    streaming = {"sweep_done": "0", "batches": "20", "expired_seen": "119800", "batch_size": "500"}
    assert batch_total(streaming, 17) == "~240"
    # No guard count yet, or one the sweep has already outrun: no total rather than a wrong one.
    assert batch_total({"sweep_done": "0", "batch_size": "500"}, 17) == ""
    assert batch_total(streaming | {"expired_seen": "1000"}, 17) == ""
    assert batch_total(None, 17) == ""


def test_the_label_names_batch_and_total_but_no_key():
    label = payload().describe(of="240")
    assert label == "statements 2026-10-23 batch 17/240 (500 keys)"
    assert payload(attempt=2).describe(of="~240") == (
        "statements 2026-10-23 batch 17/~240 (500 keys) attempt 3"
    )
    assert "cust" not in label
