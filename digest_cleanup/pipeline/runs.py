"""Run state in Redis: one hash per run, updated only by atomic scripts.

Delivery is at-least-once, so every write that counts is keyed by a *claim*
(``batch id / generation / attempt``): the first delivery that records an
attempt owns it, and any duplicate is told so and counts nothing.  A run ends
when the sweep is done and no batch is in flight; the script that brings the
in-flight count to zero decides the final status, so exactly one caller sees
``finished``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import redis
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

# epoch_of and now_iso are also imported from here by callers that predate the clock module.
from digest_cleanup.clock import epoch_of as epoch_of
from digest_cleanup.clock import now_iso as now_iso
from digest_cleanup.errors import RunStateError

#: Counters every run carries, all starting at 0.
COUNTERS = (
    "listed",
    "expired",
    "batches",
    "batches_done",
    "deleted",
    "dead_lettered",
    "skipped",
    "retries",
    "redriven",
    "duplicates",
    "inflight",
)
#: Plain fields that hold a yes or no.
BOOL_FIELDS = frozenset(
    {"dry_run", "sweep_done", "forced", "conditional_deletes", "report_pending"}
)
#: Plain fields that hold whole numbers.
INT_FIELDS = frozenset({"batch_size", "max_delete", "expired_seen", "sweep_errors"})
#: Statuses a run can be in; the last three are final until a redrive reopens it.
Status = Literal["running", "complete", "complete_with_failures", "failed"]
FINAL_STATUSES = frozenset({"complete", "complete_with_failures", "failed"})
#: How long a finished run's state stays in Redis; the audit report is the durable record.
RUN_TTL_SECONDS = 35 * 24 * 3600
#: The keys of one run's state: its hash (no suffix) and the ``run:ID:SUFFIX`` keys.
RUN_KEY_SUFFIXES = (
    "",
    "checkpoint",
    "claims",
    "pending",
    "retry_codes",
    "retried_codes",
    "deliveries",
    "staged",
    "skipped_items",
    "sweep_lease",
)
#: Upper bounds (seconds) of the enqueue-to-acknowledgement latency histogram.
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

# Finish the run if the sweep is done and nothing is in flight.  Shared by the
# scripts below; expects `run` and `now` to be set.
_FINISH_LUA = """
local function finish(run, now)
  local h = redis.call('HMGET', run, 'status', 'sweep_done', 'inflight', 'expired',
                       'deleted', 'dead_lettered', 'skipped')
  if h[2] ~= '1' or tonumber(h[3]) ~= 0 or h[1] ~= 'running' then return 0 end
  local expired, deleted = tonumber(h[4]), tonumber(h[5])
  local dead, skipped = tonumber(h[6]), tonumber(h[7])
  local status = 'complete'
  if expired ~= deleted + dead + skipped then
    status = 'failed'
    redis.call('HSET', run, 'reason', 'accounting_mismatch',
      'message', 'expired (' .. expired .. ') != deleted + dead_lettered + skipped (' ..
      (deleted + dead + skipped) .. ')')
  elseif dead > 0 then
    status = 'complete_with_failures'
  end
  redis.call('HSET', run, 'status', status, 'ended_at', now)
  return 1
end
"""

_OPEN_LUA = """
local run = KEYS[1]
if redis.call('EXISTS', run) == 1 then return redis.call('HGET', run, 'status') end
local fields = cjson.decode(ARGV[1])
for k, v in pairs(fields) do redis.call('HSET', run, k, v) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[3])
return 'created'
"""

_CHECKPOINT_LUA = (
    _FINISH_LUA
    + """
local run, cp, lease = KEYS[1], KEYS[2], KEYS[4]
if redis.call('EXISTS', run) == 0 then return 'missing' end
-- The fence: only the slice holding the sweep lease may write, and writing renews it.
if redis.call('GET', lease) ~= ARGV[5] then return 'fenced' end
redis.call('PEXPIRE', lease, ARGV[6])
local c = cjson.decode(ARGV[1])
redis.call('SET', cp, ARGV[1])
redis.call('HSET', run, 'listed', c.listed, 'expired', c.expired, 'batches', c.seq,
           'sweep_heartbeat', ARGV[2])
redis.call('HSET', run, 'sweep_errors', 0)
local new = tonumber(ARGV[4])
if new > 0 then
  redis.call('HINCRBY', run, 'inflight', new)
  for i = 7, #ARGV do redis.call('ZADD', KEYS[3], ARGV[3], ARGV[i]) end
end
if c.done then
  redis.call('HSET', run, 'sweep_done', 1, 'swept_at', ARGV[2])
  if finish(run, ARGV[2]) == 1 then return 'finished' end
end
return 'saved'
"""
)

_RECORD_LUA = (
    _FINISH_LUA
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
for _, line in ipairs(r.skipped_items) do redis.call('RPUSH', KEYS[8], line) end
if r.bucket ~= '' then
  redis.call('HINCRBY', hist, r.bucket, 1)
  redis.call('HINCRBY', hist, 'count', 1)
  redis.call('HINCRBYFLOAT', hist, 'sum', r.latency)
end
if r.service >= 0 then
  redis.call('LPUSH', KEYS[6], r.service .. ' ' .. r.delete_seconds .. ' ' .. r.items)
  redis.call('LTRIM', KEYS[6], 0, 1999)
end
if r.terminal then
  redis.call('HINCRBY', run, 'inflight', -1)
  if r.first_generation then redis.call('HINCRBY', run, 'batches_done', 1) end
  redis.call('ZREM', pending, r.batch_id)
  if finish(run, ARGV[3]) == 1 then return 'finished' end
end
return 'recorded'
"""
)

_ABORT_LUA = """
local run = KEYS[1]
if redis.call('EXISTS', run) == 0 then return 'missing' end
local status = redis.call('HGET', run, 'status')
if status ~= 'running' then return status end
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


@dataclasses.dataclass(frozen=True, slots=True)
class BatchRecord:
    """What one batch attempt did, as recorded against its run."""

    batch_id: str
    claim: str
    deleted: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    #: 1 when this attempt published a retry for some of its items.
    retries: int = 0
    #: Failing items by error code (retried or dead-lettered).
    codes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: Error codes of the items this attempt retried, for the retries-by-code metric.
    retried_codes: Sequence[str] = ()
    #: True when nothing of this batch is left in flight after this attempt.
    terminal: bool = True
    #: False for a redriven batch, which must not count as another batch done.
    first_generation: bool = True
    #: Seconds from publish to acknowledgement, for the latency histogram.
    latency: float | None = None
    #: Wall seconds of the whole attempt and of the store's delete call, with the item
    #: count: the service times capacity planning and the benchmark read.
    service_seconds: float | None = None
    delete_seconds: float = 0.0
    items: int = 0
    #: The items this attempt left alone on purpose, as ``(item, code, message)``.
    skipped_items: Sequence[tuple[str, str, str]] = ()


@dataclasses.dataclass(frozen=True)
class RunView:
    """A read-only snapshot of one run."""

    run_id: str
    fields: Mapping[str, str]

    def __getitem__(self, name: str) -> str:
        return self.fields[name]

    @property
    def status(self) -> str:
        return self.fields.get("status", "unknown")

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def count(self, name: str) -> int:
        return int(self.fields.get(name, 0) or 0)

    def as_dict(self) -> dict[str, Any]:
        """The run as JSON-able data: counters as ints, empty fields dropped."""
        out: dict[str, Any] = {"run_id": self.run_id}
        for key, value in sorted(self.fields.items()):
            if key in COUNTERS or key in INT_FIELDS:
                out[key] = int(value or 0)
            elif key in (
                "dry_run",
                "sweep_done",
                "forced",
                "conditional_deletes",
                "report_pending",
            ):
                out[key] = value == "1"
            elif key == "sample":
                out[key] = json.loads(value)
            elif value != "":
                out[key] = value
        for key in COUNTERS:
            out.setdefault(key, 0)
        return out


class RunStore:
    """Reads and writes run state; every counting write is an atomic script."""

    def __init__(self, client: redis.Redis, prefix: str = "dc") -> None:
        self.redis = client
        self.prefix = prefix
        self._open = client.register_script(_OPEN_LUA)
        self._checkpoint = client.register_script(_CHECKPOINT_LUA)
        self._record = client.register_script(_RECORD_LUA)
        self._fail = client.register_script(_FAIL_LUA)
        self._delivery = client.register_script(_DELIVERY_LUA)
        self._abort = client.register_script(_ABORT_LUA)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def run_key(self, run_id: str, suffix: str = "") -> str:
        return self.key("run", run_id) + (f":{suffix}" if suffix else "")

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
            keys=[self.run_key(run_id), self.key("runs"), self.key("target", target, "latest")],
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

    def update(self, run_id: str, **fields: Any) -> None:
        """Set plain fields (not counters) on an existing run."""
        self.redis.hset(self.run_key(run_id), mapping={k: _field(v) for k, v in fields.items()})

    def clear(self, run_id: str, *fields: str) -> None:
        """Remove plain fields from a run."""
        self.redis.hdel(self.run_key(run_id), *fields)

    def take_lease(self, run_id: str, seconds: float) -> str | None:
        """Take the sweep lease of ``run_id`` for ``seconds``; its fence, or None.

        Only the holder's checkpoints are written (see :meth:`save_checkpoint`), so a
        slice that outran its lease and overlaps a redelivered one cannot count the
        same batches twice.  The lease is a redis-py lock whose token is the fence:
        the checkpoint script reads the same key and compares the same value.
        """
        fence = uuid.uuid4().hex
        lease = self._lock(self.run_key(run_id, "sweep_lease"), fence, seconds)
        return fence if lease.acquire(token=fence) else None

    def holds_lease(self, run_id: str, token: str) -> bool:
        """True while the fence ``token`` still holds the sweep lease of ``run_id``."""
        return self._lock(self.run_key(run_id, "sweep_lease"), token).owned()

    def release_lease(self, run_id: str, token: str) -> None:
        """Give the lease back, if the fence ``token`` still holds it."""
        _release(self._lock(self.run_key(run_id, "sweep_lease"), token))

    def _lock(self, key: str, token: str, seconds: float | None = None) -> Lock:
        """A non-blocking lock on ``key`` held under ``token``, the value stored at ``key``.

        The token is explicit rather than per thread: whoever knows it (the slice
        that took the lease, a redelivered trigger) is the holder.
        """
        lock = Lock(self.redis, key, timeout=seconds, blocking=False, thread_local=False)
        lock.local.token = token.encode()
        return lock

    def save_checkpoint(
        self,
        run_id: str,
        checkpoint: Mapping[str, Any],
        new_batches: list[str],
        *,
        lease: str,
        lease_seconds: float,
    ) -> str:
        """Store the sweep checkpoint and the sweep-owned counters in one step.

        ``new_batches`` are batch ids entering flight for the first time; they are
        counted in ``inflight`` exactly once, even when the sweep resumes and
        publishes its outbox again.  Only the holder of ``lease`` writes, renewing it
        for ``lease_seconds``; any other caller gets ``fenced`` and changes nothing.
        A checkpoint is progress, so it also clears the sweep's error count.
        """
        result = self._checkpoint(
            keys=[
                self.run_key(run_id),
                self.run_key(run_id, "checkpoint"),
                self.run_key(run_id, "pending"),
                self.run_key(run_id, "sweep_lease"),
            ],
            args=[
                json.dumps(checkpoint),
                now_iso(),
                time.time(),
                len(new_batches),
                lease,
                int(lease_seconds * 1000),
                *new_batches,
            ],
        )
        return as_text(result)

    def count_sweep_error(self, run_id: str) -> int:
        """Count one failed sweep slice since the last checkpoint; returns the count."""
        return int(self.redis.hincrby(self.run_key(run_id), "sweep_errors", 1))

    def stage(self, run_id: str, batches: Sequence[Sequence[Any]]) -> int:
        """Append batches of expired items to the run's staged list; returns its length.

        The guard pass stages what it counted, so publishing reads the batches back
        instead of listing the target a second time (see :mod:`digest_cleanup.pipeline.sweep`).
        """
        key = self.run_key(run_id, "staged")
        return int(self.redis.rpush(key, *(json.dumps(list(b)) for b in batches)))

    def staged(self, run_id: str, start: int, count: int) -> list[list[Any]]:
        """Up to ``count`` staged batches from index ``start`` on, in the order staged."""
        raw = self.redis.lrange(self.run_key(run_id, "staged"), start, start + count - 1)
        return [list(json.loads(batch)) for batch in raw]

    def keep_staged(self, run_id: str, batches: int) -> None:
        """Keep the first ``batches`` staged batches and drop the rest (all of them for 0).

        A guard slice that dies after staging a batch but before its checkpoint
        leaves that batch behind; the next slice lists its items again from the
        checkpoint's cursor, so it drops the leftover first.
        """
        key = self.run_key(run_id, "staged")
        if batches <= 0:
            self.redis.delete(key)
        else:
            self.redis.ltrim(key, 0, batches - 1)

    def load_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        raw = self.redis.get(self.run_key(run_id, "checkpoint"))
        return None if raw is None else dict(json.loads(raw))

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
            "items": rec.items,
            "skipped_items": [
                json.dumps({"key": i, "code": c, "message": m[:500]})
                for i, c, m in rec.skipped_items
            ],
        }
        result = self._record(
            keys=[
                self.run_key(run_id),
                self.run_key(run_id, "claims"),
                self.run_key(run_id, "pending"),
                self.run_key(run_id, "retry_codes"),
                self.key("latency", target),
                self.key("timings", target),
                self.run_key(run_id, "retried_codes"),
                self.run_key(run_id, "skipped_items"),
            ],
            args=[rec.claim, json.dumps(payload), now_iso()],
        )
        return as_text(result)

    def skipped_items(self, run_id: str) -> Iterator[dict[str, str]]:
        """The items the run left alone on purpose, with their code and why."""
        for raw in self.redis.lrange(self.run_key(run_id, "skipped_items"), 0, -1):
            yield dict(json.loads(raw))

    def timings(self, target: str, limit: int = 2000) -> list[tuple[float, float, int]]:
        """Recent attempts of a target, newest first: (attempt s, delete s, items)."""
        raw = self.redis.lrange(self.key("timings", target), 0, limit - 1)
        rows = []
        for line in raw:
            service, delete, items = as_text(line).split()
            rows.append((float(service), float(delete), int(items)))
        return rows

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
        """Batch attempts that published a retry, by the error code of the retried items."""
        raw = self.redis.hgetall(self.run_key(run_id, "retried_codes"))
        return {as_text(k): int(v) for k, v in raw.items()}

    def is_recorded(self, run_id: str, claim: str) -> bool:
        """True when an attempt with this claim has already been recorded."""
        return bool(self.redis.sismember(self.run_key(run_id, "claims"), claim))

    def is_pending(self, run_id: str, batch_id: str) -> bool:
        """True when the sweep published ``batch_id`` for this run and it has not ended."""
        return self.redis.zscore(self.run_key(run_id, "pending"), batch_id) is not None

    def pending(self, run_id: str) -> list[tuple[str, float]]:
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

    def claim_slot(self, target: str, slot: str, holder: str, seconds: int) -> bool:
        """Claim a target's scheduled slot for ``holder`` (a trigger's task id), once.

        True for the first claim and for the same holder again (its redelivery must
        still start the run); False when another holder has it.
        """
        claim = self._lock(self.key("slot", target, slot), holder, seconds)
        return bool(claim.acquire(token=holder)) or claim.owned()

    def release_slot(self, target: str, slot: str, holder: str) -> None:
        """Free a slot claim, if ``holder`` still has it (its run could not start)."""
        _release(self._lock(self.key("slot", target, slot), holder))

    def mark_success(self, target: str) -> None:
        """Record now as the target's last complete run."""
        self.redis.set(self.key("target", target, "last_success"), now_iso())

    def last_success(self, target: str) -> str | None:
        raw = self.redis.get(self.key("target", target, "last_success"))
        return None if raw is None else as_text(raw)

    def latency(self, target: str) -> dict[str, str]:
        """The target's enqueue-to-acknowledgement histogram (bucket -> count, sum, count)."""
        raw = self.redis.hgetall(self.key("latency", target))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def save_verify(self, target: str, result: Mapping[str, Any]) -> None:
        """Keep the target's latest ``verify`` result, which the metrics read."""
        self.redis.hset(
            self.key("target", target, "verify"), mapping={k: str(v) for k, v in result.items()}
        )

    def last_verify(self, target: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.key("target", target, "verify"))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def latest(self, target: str) -> str | None:
        raw = self.redis.get(self.key("target", target, "latest"))
        return None if raw is None else as_text(raw)

    def run_ids(self, limit: int = 50) -> Iterator[str]:
        """Most recent runs first."""
        for raw in self.redis.zrevrange(self.key("runs"), 0, limit - 1):
            yield as_text(raw)


def _release(lock: Lock) -> None:
    """Free ``lock`` if its token still holds it; one that expired or was taken over stays."""
    with contextlib.suppress(LockNotOwnedError):
        lock.release()


def _field(value: Any) -> str | int | float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    return json.dumps(value)


def as_text(value: Any) -> str:
    """A Redis reply as text (redis-py returns bytes unless told otherwise)."""
    return value.decode() if isinstance(value, bytes) else str(value)
