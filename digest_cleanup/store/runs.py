"""Run state in Redis: one hash per run, updated only by atomic scripts.

Delivery is at-least-once, so every write that counts is keyed by a *claim*
(``batch id / generation / attempt``): the first delivery that records an
attempt owns it, and any duplicate is told so and counts nothing.  A run ends
when the sweep is done and no batch is in flight; the script that brings the
in-flight count to zero decides the final status, so exactly one caller sees
``finished``.

:class:`RunStore` is the one object the pipeline uses: the run and its
transitions here, the sweep's lease and checkpoint in
:mod:`~digest_cleanup.store.sweeps`, each target's state in
:mod:`~digest_cleanup.store.target_records`, and the fields and final
statuses of a run's record in :mod:`~digest_cleanup.model.run_view`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from digest_cleanup.clock import now_iso
from digest_cleanup.errors import RunStateError
from digest_cleanup.model.batches import BatchPayload, BatchRecord, unpublished_keys
from digest_cleanup.model.run_view import COUNTERS, RunView
from digest_cleanup.store.keys import RUN_KEY_SUFFIXES, RUN_TTL_SECONDS, as_text
from digest_cleanup.store.scripts import Script
from digest_cleanup.store.sweeps import SweepState
from digest_cleanup.store.target_records import LATENCY_BUCKETS, TargetState

#: The run's keys an attempt's record writes, each named in run_record.lua as its suffix.
_RECORDED = ("claims", "pending", "retry_codes", "retried_codes", "skipped_keys", "progress",
             "chains")  # fmt: skip
#: Progress samples kept per run (``run:ID:progress``): one a recorded attempt, so a run of
#: more attempts keeps its latest ones, enough for the console's chart.
PROGRESS_SAMPLES = 2000


class RunStore(SweepState, TargetState):
    """Reads and writes run state; every counting write is an atomic script."""

    def __init__(self, client: redis.Redis, prefix: str = "dc") -> None:
        super().__init__(client, prefix)
        self._open = Script(client, "run_open.lua")
        self._record = Script(client, "run_record.lua")
        self._fail = Script(client, "run_fail.lua")
        self._delivery = Script(client, "run_delivery.lua")
        self._abort = Script(client, "run_abort.lua")

    def open(self, run_id: str, fields: Mapping[str, Any]) -> str:
        """Create the run unless it exists; return ``created`` or the existing status."""
        now = now_iso()
        data = dict.fromkeys(COUNTERS, 0) | {
            "status": "running",
            "created_at": now,
            # A new token per incarnation: batches published before a Redis restart or a
            # run restart carry the old one and are refused, not counted in this run.
            "token": uuid.uuid4().hex,
            "sweep_done": 0,
            **{k: _field(v) for k, v in fields.items()},
        }
        target = str(fields["target"])
        result = self._open(
            keys={
                "run": self.run_key(run_id),
                "runs": self.key("runs"),
                "latest": self.latest_key(target),
            },
            args={"fields": json.dumps(data), "opened_at": time.time(), "run_id": run_id},
        )
        return as_text(result)

    def get(self, run_id: str) -> RunView:
        fields = self.redis.hgetall(self.run_key(run_id))
        if not fields:
            raise RunStateError(
                f"no run {run_id!r} in the run store; list runs with 'digest-cleanup runs'"
            )
        return RunView(run_id, {as_text(k): as_text(v) for k, v in fields.items()})

    def find(self, run_id: str) -> RunView | None:
        try:
            return self.get(run_id)
        except RunStateError:
            return None

    def run_status(self, run_id: str) -> dict[str, str]:
        """The run's ``status`` and ``reason`` alone: one cheap read before each delete."""
        status, reason = self.redis.hmget(self.run_key(run_id), ["status", "reason"])
        return {"status": as_text(status or ""), "reason": as_text(reason or "")}

    def is_published(self, payload: BatchPayload) -> bool:
        """True when the run published ``payload``'s batch with every key and condition."""
        published = self.published_digest(payload.run_id, payload.batch_id)
        return published is not None and not unpublished_keys(published, payload)

    def update(self, run_id: str, **fields: Any) -> None:
        """Set plain fields (not counters) on an existing run."""
        self.redis.hset(self.run_key(run_id), mapping={k: _field(v) for k, v in fields.items()})

    def clear(self, run_id: str, *fields: str) -> None:
        """Remove plain fields from a run."""
        self.redis.hdel(self.run_key(run_id), *fields)

    def record(self, run_id: str, target: str, rec: BatchRecord) -> str:
        """Count one batch attempt once; returns recorded, finished, duplicate or missing."""
        bucket = ""
        if rec.latency is not None:
            bucket = next((str(b) for b in LATENCY_BUCKETS if rec.latency <= b), "+Inf")
        payload = {
            "batch_id": rec.batch_id,
            "deleted": rec.deleted,
            "dead_lettered": rec.dead_lettered,
            "skipped": rec.skipped,
            "retries": rec.retries,
            "codes": dict(rec.codes),
            "retried": sorted(set(rec.retried_codes)),
            "terminal": rec.terminal,
            "first_generation": rec.first_generation,
            "bucket": bucket,
            "latency": rec.latency or 0.0,
            "service": -1 if rec.service_seconds is None else round(rec.service_seconds, 5),
            "delete_seconds": round(rec.delete_seconds, 5),
            "items": rec.keys,
            "skipped_keys": [
                json.dumps({"key": i, "code": c, "message": m[:500]})
                for i, c, m in rec.skipped_keys
            ],
        }
        result = self._record(
            keys={
                **{name: self.run_key(run_id, name) for name in _RECORDED},
                "run": self.run_key(run_id),
                "latency": self.latency_key(target),
                "timings": self.timings_key(target),
            },
            args={
                "claim": rec.claim,
                "attempt": json.dumps(payload),
                "now": now_iso(),
                "now_epoch": round(time.time(), 3),
                "progress_samples": PROGRESS_SAMPLES,
            },
        )
        return as_text(result)

    def skipped_keys(self, run_id: str) -> Iterator[dict[str, str]]:
        """The keys the run left alone on purpose, with their code and why."""
        for raw in self.redis.lrange(self.run_key(run_id, "skipped_keys"), 0, -1):
            yield dict(json.loads(raw))

    def progress(self, run_id: str) -> list[tuple[float, int, int]]:
        """The run's samples, oldest first: ``(epoch seconds, deleted, keys done)``."""
        samples = []
        for raw in self.redis.lrange(self.run_key(run_id, "progress"), 0, -1):
            at, deleted, done = as_text(raw).split()
            samples.append((float(at), int(deleted), int(done)))
        return samples

    def count_delivery(self, run_id: str, claim: str) -> int:
        """Count one delivery of a batch attempt; more than one is a duplicate delivery."""
        return int(
            self._delivery(
                keys={
                    "deliveries": self.run_key(run_id, "deliveries"),
                    "run": self.run_key(run_id),
                },
                args={"claim": claim},
            )
        )

    def fail(self, run_id: str, reason: str, message: str) -> bool:
        """End a run as ``failed`` with a short reason code and a sentence for humans."""
        return bool(
            self._fail(
                keys={"run": self.run_key(run_id)},
                args={"reason": reason, "message": message, "now": now_iso()},
            )
        )

    def abort(self, run_id: str, message: str) -> str:
        """End a running run as ``failed`` (``aborted``), taking its sweep lease away.

        A run already ``failed`` for another reason is marked ``aborted`` too, so the
        dead letters an operator redrives into it are refused from then on.

        Returns ``aborted``, ``missing``, or the status of a run that was not running
        (which is left as it was).  Batches still in flight are recorded as usual
        but cannot reopen it; the run's next trigger starts it over.
        """
        result = self._abort(
            keys={"run": self.run_key(run_id), "lease": self.run_key(run_id, "sweep_lease")},
            args={"message": message, "now": now_iso()},
        )
        return as_text(result)

    def retry_codes(self, run_id: str) -> dict[str, int]:
        raw = self.redis.hgetall(self.run_key(run_id, "retry_codes"))
        return {as_text(k): int(v) for k, v in raw.items()}

    def retried_codes(self, run_id: str) -> dict[str, int]:
        """Batch attempts that published a retry, by the error code of the retried keys."""
        raw = self.redis.hgetall(self.run_key(run_id, "retried_codes"))
        return {as_text(k): int(v) for k, v in raw.items()}

    def is_recorded(self, run_id: str, claim: str) -> bool:
        """True when an attempt with this claim has already been recorded."""
        return bool(self.redis.sismember(self.run_key(run_id, "claims"), claim))

    def is_redriven(self, run_id: str, batch_id: str) -> bool:
        """True when an operator redrove a dead letter of ``batch_id`` in this run."""
        return bool(self.redis.sismember(self.run_key(run_id, "redriven"), batch_id))

    def is_in_flight(self, run_id: str, batch_id: str) -> bool:
        """True when the sweep published ``batch_id`` for this run and it has not ended."""
        return self.redis.zscore(self.run_key(run_id, "pending"), batch_id) is not None

    def in_flight(self, run_id: str) -> list[tuple[str, float]]:
        """Batches in flight with the time they were published (oldest first)."""
        raw: list[tuple[bytes, float]] = self.redis.zrange(  # type: ignore[assignment]
            self.run_key(run_id, "pending"), 0, -1, withscores=True
        )
        return [(as_text(m), float(s)) for m, s in raw]

    def reset(self, run_id: str) -> None:
        """Forget a run entirely, so the same run id can start over."""
        self.redis.delete(*(self.run_key(run_id, s) for s in RUN_KEY_SUFFIXES))

    def expire(self, run_id: str) -> None:
        """Let a finished run's state age out of Redis."""
        pipe = self.redis.pipeline()
        for suffix in RUN_KEY_SUFFIXES:
            pipe.expire(self.run_key(run_id, suffix), RUN_TTL_SECONDS)
        pipe.execute()

    def run_ids(self, limit: int = 50) -> Iterator[str]:
        """Most recent runs first."""
        for raw in self.redis.zrevrange(self.key("runs"), 0, limit - 1):
            yield as_text(raw)


def _field(value: Any) -> str | int | float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    return json.dumps(value)
