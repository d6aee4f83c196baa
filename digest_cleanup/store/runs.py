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
from digest_cleanup.model.run_view import (
    COUNTERS,
    FINISH_LUA,
    RunView,
)
from digest_cleanup.store.keys import RUN_KEY_SUFFIXES, RUN_TTL_SECONDS, as_text
from digest_cleanup.store.sweeps import SweepState
from digest_cleanup.store.target_records import LATENCY_BUCKETS, TargetState

_OPEN_LUA = """
local run = KEYS[1]
if redis.call('EXISTS', run) == 1 then return redis.call('HGET', run, 'status') end
local fields = cjson.decode(ARGV[1])
for k, v in pairs(fields) do redis.call('HSET', run, k, v) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[3])
return 'created'
"""

_RECORD_LUA = (
    FINISH_LUA
    + """
local run, claims, pending, codes, hist = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
if redis.call('EXISTS', run) == 0 then return 'missing' end
if redis.call('SADD', claims, ARGV[1]) == 0 then return 'duplicate' end
local r = cjson.decode(ARGV[2])
redis.call('HINCRBY', run, 'deleted', r.deleted)
redis.call('HINCRBY', run, 'dead_lettered', r.dead_lettered)
redis.call('HINCRBY', run, 'skipped', r.skipped)
redis.call('HINCRBY', run, 'retries', r.retries)
redis.call('HSET', run, 'last_batch_at', ARGV[3])
for code, n in pairs(r.codes) do redis.call('HINCRBY', codes, code, n) end
for _, code in ipairs(r.retried) do redis.call('HINCRBY', KEYS[7], code, 1) end
for _, line in ipairs(r.skipped_keys) do redis.call('RPUSH', KEYS[8], line) end
if r.bucket ~= '' then
  redis.call('HINCRBY', hist, r.bucket, 1)
  redis.call('HINCRBY', hist, 'count', 1)
  redis.call('HINCRBYFLOAT', hist, 'sum', r.latency)
end
if r.service >= 0 then
  redis.call('LPUSH', KEYS[6], r.service .. ' ' .. r.delete_seconds .. ' ' .. r.items)
  redis.call('LTRIM', KEYS[6], 0, 1999)
end
-- The console's progress chart: the counts just written, one sample an attempt.
local h = redis.call('HMGET', run, 'deleted', 'dead_lettered', 'skipped')
local done = tonumber(h[1]) + tonumber(h[2] or 0) + tonumber(h[3] or 0)
redis.call('RPUSH', KEYS[9], ARGV[4] .. ' ' .. h[1] .. ' ' .. done)
redis.call('LTRIM', KEYS[9], -tonumber(ARGV[5]), -1)
local ttl = redis.call('TTL', run)
if ttl > 0 then redis.call('EXPIRE', KEYS[9], ttl) end
-- A batch is in flight once per chain of attempts: the sweep's, and one per redrive
-- (KEYS[10] counts them).  A chain ends once: a second terminal attempt of it (a
-- redelivery that overlapped its own retry, or a forgery) moves nothing more.
if r.terminal then
  local chains, left = KEYS[10], -1
  if redis.call('HEXISTS', chains, r.batch_id) == 1 then
    left = redis.call('HINCRBY', chains, r.batch_id, -1)
    if left < 0 then redis.call('HSET', chains, r.batch_id, 0) end
  elseif redis.call('ZSCORE', pending, r.batch_id) then
    left = 0  -- a run from before chains were counted: one chain per batch
  end
  if left >= 0 then
    redis.call('HINCRBY', run, 'inflight', -1)
    if r.first_generation then redis.call('HINCRBY', run, 'batches_done', 1) end
    if left == 0 then redis.call('ZREM', pending, r.batch_id) end
    if finish(run, ARGV[3]) == 1 then return 'finished' end
  end
end
return 'recorded'
"""
)

_ABORT_LUA = """
local run = KEYS[1]
if redis.call('EXISTS', run) == 0 then return 'missing' end
local status = redis.call('HGET', run, 'status')
-- A failed run still deletes what an operator redrives; aborting it stops that too.
local reason = redis.call('HGET', run, 'reason')
if status ~= 'running' and not (status == 'failed' and reason ~= 'aborted') then
  return status
end
redis.call('HSET', run, 'status', 'failed', 'reason', 'aborted', 'message', ARGV[1],
           'ended_at', ARGV[2], 'sweep_done', 1)
redis.call('DEL', KEYS[2])
return 'aborted'
"""

_FAIL_LUA = """
local run = KEYS[1]
if redis.call('EXISTS', run) == 0 then return 0 end
redis.call('HSET', run, 'status', 'failed', 'reason', ARGV[1], 'message', ARGV[2],
           'ended_at', ARGV[3], 'sweep_done', 1)
return 1
"""

_DELIVERY_LUA = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if n > 1 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', 1)
end
return n
"""


#: Progress samples kept per run (``run:ID:progress``): one a recorded attempt, so a run of
#: more attempts keeps its latest ones, enough for the console's chart.
PROGRESS_SAMPLES = 2000


class RunStore(SweepState, TargetState):
    """Reads and writes run state; every counting write is an atomic script."""

    def __init__(self, client: redis.Redis, prefix: str = "dc") -> None:
        super().__init__(client, prefix)
        self._open = client.register_script(_OPEN_LUA)
        self._record = client.register_script(_RECORD_LUA)
        self._fail = client.register_script(_FAIL_LUA)
        self._delivery = client.register_script(_DELIVERY_LUA)
        self._abort = client.register_script(_ABORT_LUA)

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
            keys=[self.run_key(run_id), self.key("runs"), self.latest_key(target)],
            args=[json.dumps(data), time.time(), run_id],
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
            keys=[
                self.run_key(run_id),
                self.run_key(run_id, "claims"),
                self.run_key(run_id, "pending"),
                self.run_key(run_id, "retry_codes"),
                self.latency_key(target),
                self.timings_key(target),
                self.run_key(run_id, "retried_codes"),
                self.run_key(run_id, "skipped_keys"),
                self.run_key(run_id, "progress"),
                self.run_key(run_id, "chains"),
            ],
            args=[rec.claim, json.dumps(payload), now_iso(), round(time.time(), 3),
                  PROGRESS_SAMPLES],
        )  # fmt: skip
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
                keys=[self.run_key(run_id, "deliveries"), self.run_key(run_id)], args=[claim]
            )
        )

    def fail(self, run_id: str, reason: str, message: str) -> bool:
        """End a run as ``failed`` with a short reason code and a sentence for humans."""
        return bool(self._fail(keys=[self.run_key(run_id)], args=[reason, message, now_iso()]))

    def abort(self, run_id: str, message: str) -> str:
        """End a running run as ``failed`` (``aborted``), taking its sweep lease away.

        A run already ``failed`` for another reason is marked ``aborted`` too, so the
        dead letters an operator redrives into it are refused from then on.

        Returns ``aborted``, ``missing``, or the status of a run that was not running
        (which is left as it was).  Batches still in flight are recorded as usual
        but cannot reopen it; the run's next trigger starts it over.
        """
        result = self._abort(
            keys=[self.run_key(run_id), self.run_key(run_id, "sweep_lease")],
            args=[message, now_iso()],
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
