"""A run's record in Redis: one hash per run, and the keys its attempts count in.

Delivery is at-least-once, so every write that counts is keyed by a *claim*
(``batch id / generation / attempt``): the first delivery that records an
attempt owns it, and any duplicate is told so and counts nothing.  A run ends
when the sweep is done and no batch is in flight; the script that brings the
in-flight count to zero decides the final status (``finish`` in
``scripts/finish.lua``), so exactly one caller sees ``finished``.

:class:`RunRecords` owns the run's keys (see :mod:`~digest_cleanup.store.keys`).
The scripts of other parts that move a run's counters in their own atomic step
include this part's fragments: the checkpoint ``run_sweep.lua``, a redrive
``run_redrive.lua``.  The fields and final statuses of a run's record are in
:mod:`~digest_cleanup.model.run_view`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import redis
from redis.client import Pipeline

from digest_cleanup.clock import now_iso
from digest_cleanup.errors import RunStateError
from digest_cleanup.model.batches import BatchRecord
from digest_cleanup.model.run_view import COUNTERS, RunView
from digest_cleanup.store.connection import as_text
from digest_cleanup.store.keys import RUN_SUFFIXES, RUN_TTL_SECONDS, Keys
from digest_cleanup.store.scripts import Script

#: Upper bounds (seconds) of the enqueue-to-acknowledgement latency histogram.
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Progress samples kept per run (``run:ID:progress``): one a recorded attempt, so a run of
#: more attempts keeps its latest ones, enough for the console's chart.
PROGRESS_SAMPLES = 2000
#: The run's keys an attempt's record writes, each named in run_record.lua as its suffix.
_RECORDED = ("claims", "pending", "retry_codes", "retried_codes", "skipped_keys", "progress",
             "chains")  # fmt: skip


class RunRecords:
    """Reads and writes runs; every counting write is an atomic script."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
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
                "run": self.keys.run(run_id),
                "runs": self.keys.runs(),
                "latest": self.keys.latest(target),
            },
            args={"fields": json.dumps(data), "opened_at": time.time(), "run_id": run_id},
        )
        return as_text(result)

    def get(self, run_id: str) -> RunView:
        fields = self.client.hgetall(self.keys.run(run_id))
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
        status, reason = self.client.hmget(self.keys.run(run_id), ["status", "reason"])
        return {"status": as_text(status or ""), "reason": as_text(reason or "")}

    def update(self, run_id: str, **fields: Any) -> None:
        """Set plain fields (not counters) on an existing run."""
        self.client.hset(self.keys.run(run_id), mapping={k: _field(v) for k, v in fields.items()})

    def clear(self, run_id: str, *fields: str) -> None:
        """Remove plain fields from a run."""
        self.client.hdel(self.keys.run(run_id), *fields)

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
                **{name: self.keys.run(run_id, name) for name in _RECORDED},
                "run": self.keys.run(run_id),
                "latency": self.keys.latency(target),
                "timings": self.keys.timings(target),
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
        for raw in self.client.lrange(self.keys.run(run_id, "skipped_keys"), 0, -1):
            yield dict(json.loads(raw))

    def progress(self, run_id: str) -> list[tuple[float, int, int]]:
        """The run's samples, oldest first: ``(epoch seconds, deleted, keys done)``."""
        samples = []
        for raw in self.client.lrange(self.keys.run(run_id, "progress"), 0, -1):
            at, deleted, done = as_text(raw).split()
            samples.append((float(at), int(deleted), int(done)))
        return samples

    def count_delivery(self, run_id: str, claim: str) -> int:
        """Count one delivery of a batch attempt; more than one is a duplicate delivery."""
        return int(
            self._delivery(
                keys={
                    "deliveries": self.keys.run(run_id, "deliveries"),
                    "run": self.keys.run(run_id),
                },
                args={"claim": claim},
            )
        )

    def count_sweep_error(self, run_id: str) -> int:
        """Count one failed sweep slice since the last checkpoint; returns the count."""
        return int(self.client.hincrby(self.keys.run(run_id), "sweep_errors", 1))

    def latest(self, target: str) -> str | None:
        """The id of the target's most recent run."""
        raw = self.client.get(self.keys.latest(target))
        return None if raw is None else as_text(raw)

    def latency(self, target: str) -> dict[str, str]:
        """The target's enqueue-to-acknowledgement histogram (bucket -> count, sum, count)."""
        raw = self.client.hgetall(self.keys.latency(target))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def timings(self, target: str, limit: int = 2000) -> list[tuple[float, float, int]]:
        """Recent attempts of a target, newest first: (attempt s, delete s, keys)."""
        rows = []
        for line in self.client.lrange(self.keys.timings(target), 0, limit - 1):
            service, delete, keys = as_text(line).split()
            rows.append((float(service), float(delete), int(keys)))
        return rows

    def fail(self, run_id: str, reason: str, message: str) -> bool:
        """End a run as ``failed`` with a short reason code and a sentence for humans."""
        return bool(
            self._fail(
                keys={"run": self.keys.run(run_id)},
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
            keys={"run": self.keys.run(run_id), "lease": self.keys.sweep_lease(run_id)},
            args={"message": message, "now": now_iso()},
        )
        return as_text(result)

    def retry_codes(self, run_id: str) -> dict[str, int]:
        raw = self.client.hgetall(self.keys.run(run_id, "retry_codes"))
        return {as_text(k): int(v) for k, v in raw.items()}

    def retried_codes(self, run_id: str) -> dict[str, int]:
        """Batch attempts that published a retry, by the error code of the retried keys."""
        raw = self.client.hgetall(self.keys.run(run_id, "retried_codes"))
        return {as_text(k): int(v) for k, v in raw.items()}

    def is_recorded(self, run_id: str, claim: str) -> bool:
        """True when an attempt with this claim has already been recorded."""
        return bool(self.client.sismember(self.keys.run(run_id, "claims"), claim))

    def is_redriven(self, run_id: str, batch_id: str) -> bool:
        """True when an operator redrove a dead letter of ``batch_id`` in this run."""
        return bool(self.client.sismember(self.keys.run(run_id, "redriven"), batch_id))

    def is_in_flight(self, run_id: str, batch_id: str) -> bool:
        """True when the sweep published ``batch_id`` for this run and it has not ended."""
        return self.client.zscore(self.keys.run(run_id, "pending"), batch_id) is not None

    def in_flight(self, run_id: str) -> list[tuple[str, float]]:
        """Batches in flight with the time they were published (oldest first)."""
        raw: list[tuple[bytes, float]] = self.client.zrange(  # type: ignore[assignment]
            self.keys.run(run_id, "pending"), 0, -1, withscores=True
        )
        return [(as_text(m), float(s)) for m, s in raw]

    def forget(self, run_id: str, pipe: Pipeline) -> None:
        """Add to ``pipe`` the deletion of the run part's keys of ``run_id``."""
        pipe.delete(*(self.keys.run(run_id, s) for s in RUN_SUFFIXES))

    def expire(self, run_id: str, pipe: Pipeline) -> None:
        """Add to ``pipe`` the expiry of the run part's keys of ``run_id``."""
        for suffix in RUN_SUFFIXES:
            pipe.expire(self.keys.run(run_id, suffix), RUN_TTL_SECONDS)

    def run_ids(self, limit: int = 50) -> Iterator[str]:
        """Most recent runs first."""
        for raw in self.client.zrevrange(self.keys.runs(), 0, limit - 1):
            yield as_text(raw)


def _field(value: Any) -> str | int | float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    return json.dumps(value)
