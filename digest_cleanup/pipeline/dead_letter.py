"""The dead-letter queue: batches that still failed, waiting for an operator.

Redis has no native dead-lettering, so an entry is an ordinary Celery message
for ``digest_cleanup.delete_batch`` published to a queue no worker consumes.
Its body is already the *redrive* of the failed items (next generation, first
attempt), plus a ``dead_letter`` section saying why.

Workers only publish.  Every reader first *absorbs* what arrived: each message
moves, in one script per message, from that queue into an index this module
owns, a hash by entry id with an arrival-ordered set and a set per run and per
target.  A list would make every redrive and purge scan the whole queue (50,000
entries: the old ``LRANGE`` and ``LREM`` per entry took seconds); the index makes
showing, redriving and purging one entry cost the same at any depth (see
BENCHMARKS.md).  So:

* listing reads the index (nothing consumed, nothing reordered);
* redriving moves the message back onto the work queue, one entry per Lua
  script call, so a redrive that crashes halfway leaves each entry in exactly
  one of the two places, never in neither;
* the run's counters move in the same script (``redriven`` up,
  ``dead_lettered`` down, the run back to ``running``), and the redriven batch
  folds its outcome into its original run;
* a message delivered twice is one entry with ``copies`` 2; two messages with
  one id but different keys are both kept, the second as ``ID~HASH``.

Nothing is ever dropped to keep the queue small: ``CLEANUP_DLQ_MAX_ENTRIES`` and
``CLEANUP_DLQ_RETENTION_DAYS`` only raise an alert when reached.
"""

from __future__ import annotations

import base64
import dataclasses
import getpass
import hashlib
import json
import socket
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from digest_cleanup.errors import DeadLetterError
from digest_cleanup.kinds import ItemResult
from digest_cleanup.pipeline.batches import MAX_ITEM_LENGTH, MAX_MESSAGE_ITEMS, BatchPayload
from digest_cleanup.pipeline.runs import RunStore, as_text

#: What a failed run's message gains when its dead letters are redriven.
FAILED_RUN_NOTE = (
    "Its dead letters were redriven, but the run stays failed: trigger a new run to "
    "delete what it never listed."
)
#: Queued messages one absorbing script call moves at most: 50 of 500 keys each keep
#: Redis busy for about 30 ms, a pause the workers sharing it do not notice.
_ABSORB_BATCH = 50
#: Entries read from Redis per round trip when listing.
_LOAD_CHUNK = 500
#: Characters of a poison message's items kept in its entry; past them the rest are
#: counted, not stored.  A genuine batch is at most 1,000 keys of 1,024 characters, so
#: it is always kept whole; only a forged message can be larger.
POISON_CHARS_KEPT = 2 * MAX_MESSAGE_ITEMS * MAX_ITEM_LENGTH
#: Items longer than any key that a poison entry shows, clipped; the rest are counted.
POISON_OVERSIZED_SHOWN = 50

#: Move the oldest queued message into the index, if it is still the one read:
#: a new entry, or a copy of one already there with the same keys (``digests``
#: holds a digest of each entry's keys).  Another message with the same id but
#: other keys is merged by the caller first, so it never reaches this script.
_ABSORB_LUA = """
local queue, entries, order, copies, stats, digests, by_run, by_target = unpack(KEYS)
local raw, id, now, keys, digest = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
if redis.call('LINDEX', queue, -1) ~= raw then return 0 end
local known = redis.call('HGET', digests, id)
if known and known ~= digest then return -1 end
redis.call('RPOP', queue)
if known then
  redis.call('HINCRBY', copies, id, 1)
  return 1
end
redis.call('HSET', entries, id, raw)
redis.call('HSET', digests, id, digest)
redis.call('ZADD', order, now, id)
redis.call('SADD', by_run, id)
redis.call('SADD', by_target, id)
redis.call('HINCRBY', stats, 'keys', keys)
return 1
"""

#: Replace an entry with ``merged`` (its keys and a new message's), and take that
#: message off the queue; only if neither changed since they were read.
_MERGE_LUA = """
local queue, entries, stats, digests, copies = unpack(KEYS)
local raw, id, existing, merged, digest, added = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  tonumber(ARGV[6])
if redis.call('LINDEX', queue, -1) ~= raw then return 0 end
if redis.call('HGET', entries, id) ~= existing then return 0 end
redis.call('RPOP', queue)
redis.call('HSET', entries, id, merged)
redis.call('HSET', digests, id, digest)
redis.call('HINCRBY', copies, id, 1)
redis.call('HINCRBY', stats, 'keys', added)
return 1
"""

#: Move up to ARGV[1] queued messages that carry their index headers, oldest first;
#: stops at the first without them, or whose id holds other keys already, which
#: :meth:`DeadLetterQueue.absorb` handles itself.
_ABSORB_INDEXED_LUA = """
local queue, entries, order, copies, stats, digests = unpack(KEYS)
local limit, now, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local moved = 0
while moved < limit do
  local raw = redis.call('LINDEX', queue, -1)
  if not raw then break end
  local ok, msg = pcall(cjson.decode, raw)
  local h = ok and type(msg) == 'table' and msg.headers
  if not (h and h.id and h.dc_run and h.dc_target and h.dc_keys and h.dc_digest) then break end
  local id = h.id
  local known = redis.call('HGET', digests, id)
  if known and known ~= h.dc_digest then break end
  redis.call('RPOP', queue)
  moved = moved + 1
  if known then
    redis.call('HINCRBY', copies, id, 1)
  else
    redis.call('HSET', entries, id, raw)
    redis.call('HSET', digests, id, h.dc_digest)
    -- Index keys built here (a single Redis, not a cluster): one set per run and target.
    redis.call('ZADD', order, now, id)
    redis.call('SADD', prefix .. 'run:' .. h.dc_run, id)
    redis.call('SADD', prefix .. 'target:' .. h.dc_target, id)
    redis.call('HINCRBY', stats, 'keys', tonumber(h.dc_keys))
  end
end
return moved
"""

#: Remove one entry from the index; shared by redrive and purge, with ``raw`` set.
_TAKE_LUA = """
local function take(entries, order, copies, stats, digests, by_run, by_target, id, keys)
  local raw = redis.call('HGET', entries, id)
  if not raw then return nil end
  redis.call('HDEL', entries, id)
  redis.call('HDEL', digests, id)
  redis.call('HDEL', copies, id)
  redis.call('ZREM', order, id)
  redis.call('SREM', by_run, id)
  redis.call('SREM', by_target, id)
  redis.call('HINCRBY', stats, 'keys', -keys)
  return raw
end
"""

_REDRIVE_LUA = (
    _TAKE_LUA
    + """
local entries, order, copies, stats, digests, by_run, by_target, work, run, pending = unpack(KEYS)
local id, n, now_epoch, batch, now = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local exchange, routing_key = ARGV[6], ARGV[7]
local raw = take(entries, order, copies, stats, digests, by_run, by_target, id, n)
if not raw then return 0 end
local msg = cjson.decode(raw)
-- kombu restores an unacknowledged message to the queue its delivery_info
-- names, so point it at the work queue or a killed worker would send it back here.
msg.properties.delivery_info.exchange = exchange
msg.properties.delivery_info.routing_key = routing_key
redis.call('LPUSH', work, cjson.encode(msg))
if n > 0 and redis.call('EXISTS', run) == 1 then
  redis.call('HINCRBY', run, 'redriven', n)
  redis.call('HINCRBY', run, 'dead_lettered', -n)
  redis.call('HINCRBY', run, 'inflight', 1)
  redis.call('HSET', run, 'last_redrive_at', now)
  redis.call('ZADD', pending, now_epoch, batch)
  if redis.call('HGET', run, 'status') == 'failed' then
    -- A failed run never listed everything: its dead letters are deleted, but it
    -- stays failed, and says so, until a new run lists what it missed.
    local message = redis.call('HGET', run, 'message') or ''
    if not string.find(message, ARGV[8], 1, true) then
      redis.call('HSET', run, 'message', message .. ' ' .. ARGV[8])
    end
  else
    redis.call('HSET', run, 'status', 'running')
    redis.call('HDEL', run, 'ended_at', 'reason', 'message', 'finalized_at')
  end
end
return 1
"""
)

_PURGE_LUA = (
    _TAKE_LUA
    + """
local entries, order, copies, stats, digests, by_run, by_target, audit = unpack(KEYS)
local raw = take(entries, order, copies, stats, digests, by_run, by_target, ARGV[1],
  tonumber(ARGV[3]))
if not raw then return 0 end
redis.call('LPUSH', audit, ARGV[2])
return 1
"""
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One dead-letter entry as ops see it."""

    id: str
    payload: BatchPayload | None
    raw_kwargs: Mapping[str, Any]
    #: How many copies of this entry the queue holds (duplicates from redelivery).
    copies: int = 1

    @property
    def info(self) -> Mapping[str, Any]:
        return self.payload.dead_letter if self.payload else self.raw_kwargs.get("dead_letter", {})

    @property
    def run_id(self) -> str:
        return self.payload.run_id if self.payload else str(self.raw_kwargs.get("run_id", ""))

    @property
    def target(self) -> str:
        return self.payload.target if self.payload else str(self.raw_kwargs.get("target", ""))

    @property
    def items(self) -> list[str]:
        return self.payload.items if self.payload else list(self.info.get("items", []))

    @property
    def key_count(self) -> int:
        """Keys the entry stands for (a poison entry keeps fewer than it counts)."""
        return int(self.info.get("item_count", len(self.items)))

    @property
    def codes(self) -> set[str]:
        errors = self.info.get("errors", {})
        return {str(e[0]) for e in errors.values()} | {str(self.info.get("reason", ""))}

    def as_dict(self) -> dict[str, Any]:
        info = dict(self.info)
        errors = info.pop("errors", {})
        return {
            "id": self.id,
            "run_id": self.run_id,
            "target": self.target,
            "batch_id": self.payload.batch_id if self.payload else info.get("batch_id", ""),
            "reason": info.get("reason", ""),
            "message": info.get("message", ""),
            "key_count": int(info.get("item_count", len(self.items))),
            "keys": [
                {
                    "key": item,
                    "code": errors.get(item, [info.get("reason", ""), ""])[0],
                    "message": errors.get(item, ["", info.get("message", "")])[1],
                }
                for item in self.items
            ],
            "attempts": info.get("attempts", 0),
            "first_failure_at": info.get("first_failure_at", ""),
            "last_failure_at": info.get("last_failure_at", ""),
            "redrivable": self.payload is not None,
            "copies": self.copies,
        }


def make_entry(
    payload: BatchPayload, dead: Mapping[str, ItemResult], reason: str, message: str = ""
) -> BatchPayload:
    """The dead-letter entry for the failed items of one attempt: a ready-made redrive."""
    now = _iso_now()
    errors = {item: [r.code, r.message[:500]] for item, r in dead.items()}
    if not message:
        counts = Counter(r.code for r in dead.values())
        message = ", ".join(f"{code} x{n}" for code, n in counts.most_common())
    entry_id = f"dl-{payload.batch_id}-g{payload.generation}a{payload.attempt}"
    return payload.subset(
        list(dead),
        attempt=0,
        generation=payload.generation + 1,
        failures={},
        first_failure_at="",
        dead_letter={
            "entry_id": entry_id,
            "reason": reason,
            "message": message,
            "errors": errors,
            "attempts": payload.attempt + 1,
            "first_failure_at": payload.first_failure_at or now,
            "last_failure_at": now,
            "batch_id": payload.batch_id,
        },
    )


def index_headers(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The headers a dead-letter message carries so the index files it without decoding."""
    info = kwargs.get("dead_letter", {})
    rest = kwargs.get("rest", [])
    base = kwargs.get("base", "")
    return {
        "dc_run": str(kwargs.get("run_id", "")),
        "dc_target": str(kwargs.get("target", "")),
        "dc_keys": int(info.get("item_count", len(rest))),
        "dc_digest": keys_digest([base + r for r in rest]),
    }


def keys_digest(items: Iterable[str]) -> str:
    """A short digest of an entry's keys: copies share it, other keys do not."""
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]


def _merged(existing: bytes, incoming: bytes) -> tuple[str, int]:
    """``existing`` with the keys of ``incoming`` it lacks, and how many were added.

    Both are dead letters of one batch attempt (a redelivery that failed other keys);
    the entry keeps its own errors and adds the newcomer's.
    """
    message = json.loads(existing)
    args, _, embed = json.loads(base64.b64decode(message["body"]))
    old, new = _decode(existing).payload, _decode(incoming).payload
    if old is None or new is None:
        return existing.decode(), 0
    have = set(old.items)
    extra = [i for i in new.items if i not in have]
    conditions = dict(zip(new.items, new.conditions, strict=True)) if new.conditions else {}
    payload = old.subset(
        [*old.items, *extra],
        dead_letter={
            **old.dead_letter,
            "errors": {**new.dead_letter.get("errors", {}), **old.dead_letter.get("errors", {})},
        },
    )
    if old.conditions or conditions:
        mine = dict(zip(old.items, old.conditions, strict=True)) if old.conditions else {}
        payload = dataclasses.replace(
            payload, conditions=[mine.get(i) or conditions.get(i, "") for i in payload.items]
        )
    body = json.dumps([args, payload.to_message(), embed]).encode()
    message["body"] = base64.b64encode(body).decode()
    return json.dumps(message), len(extra)


def make_poison_entry(task_id: str, raw: Any, reason: str, message: str) -> dict[str, Any]:
    """An entry for a message that never decoded as a batch; kept small and not redrivable."""
    raw_map: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    rest: list[Any] = raw_map["rest"] if isinstance(raw_map.get("rest"), list) else []
    base: str = raw_map["base"] if isinstance(raw_map.get("base"), str) else ""
    # Clipped: a forged message may carry megabytes per item, and the entry must stay small.
    items: list[str] = []
    budget, oversized = POISON_CHARS_KEPT, 0
    for r in rest:
        if not isinstance(r, str):
            continue
        if len(base) + len(r) > MAX_ITEM_LENGTH:
            # Longer than any S3 key, so not a key: a few are shown, clipped, as evidence.
            oversized += 1
            if oversized > POISON_OVERSIZED_SHOWN:
                continue
        item = _clip(base, r)
        budget -= len(item)
        if budget < 0:
            break
        items.append(item)
    now = _iso_now()
    return {
        "run_id": str(raw_map.get("run_id", ""))[:200],
        "target": str(raw_map.get("target", ""))[:200],
        "dead_letter": {
            "entry_id": f"dl-poison-{task_id}",
            "reason": reason,
            "message": message[:500],
            "items": items,
            "item_count": len(rest),
            "errors": {},
            "attempts": 1,
            "first_failure_at": now,
            "last_failure_at": now,
            "batch_id": str(raw_map.get("batch_id", ""))[:200],
        },
    }


class DeadLetterQueue:
    """List, show, redrive and purge entries; every change is atomic per entry."""

    def __init__(
        self,
        runs: RunStore,
        *,
        queue: str,
        work_queue: str,
        work_exchange: str = "",
        work_routing_key: str = "",
    ) -> None:
        #: The run store, whose keys a redrive moves its entry's counters in.
        self.runs = runs
        client = runs.redis
        self.redis = client
        self.queue = queue
        self.work_queue = work_queue
        self.work_exchange = work_exchange or work_queue
        self.work_routing_key = work_routing_key or work_queue
        self.key_prefix = runs.prefix
        self._absorb = client.register_script(_ABSORB_LUA)
        self._absorb_indexed = client.register_script(_ABSORB_INDEXED_LUA)
        self._merge = client.register_script(_MERGE_LUA)
        self._redrive = client.register_script(_REDRIVE_LUA)
        self._purge = client.register_script(_PURGE_LUA)

    def _key(self, *parts: str) -> str:
        return ":".join((self.key_prefix, "dlq", *parts))

    def _index_keys(self, run_id: str, target: str) -> list[str]:
        """The index keys one entry lives in, in the scripts' order."""
        return [
            self._key("entries"),
            self._key("order"),
            self._key("copies"),
            self._key("stats"),
            self._key("digests"),
            self._key("run", run_id),
            self._key("target", target),
        ]

    def absorb(self) -> int:
        """Index every message workers published since the last read; returns how many.

        Each message moves only if it is still the oldest one queued, so two readers
        absorbing at once never index a message twice or lose one.  One entry per id:
        a copy (a redelivery that dead-lettered the same keys) is counted on it, and a
        message with the same id but other keys is merged into it, keys and all, so
        nothing is lost and one redrive still covers the batch.
        """
        moved = 0
        bulk_keys = [self.queue, *self._index_keys("", "")[:5]]
        while True:
            # Messages that carry their index headers move in bulk, inside Redis.
            step = int(self._absorb_indexed(
                keys=bulk_keys, args=[_ABSORB_BATCH, time.time(), self._key("")]
            ))  # fmt: skip
            moved += step
            raw = self.redis.lindex(self.queue, -1)
            if raw is None:
                return moved
            if not step:
                moved += self._absorb_one(raw if isinstance(raw, bytes) else raw.encode())

    def _absorb_one(self, raw: bytes) -> int:
        """Index one message the bulk script left: no headers, or keys to merge."""
        entry = _decode(raw)
        digest = keys_digest(entry.items) if entry.payload else keys_digest([raw.decode()])
        index = self._index_keys(entry.run_id, entry.target)
        entries, _, copies, stats, digests = index[:5]
        args: list[str | int | float | bytes] = [raw, entry.id, time.time(), entry.key_count,
                                                 digest]  # fmt: skip
        result = int(self._absorb(keys=[self.queue, *index], args=args))
        if result >= 0:
            return result
        existing: bytes | None = self.redis.hget(entries, entry.id)  # type: ignore[assignment]
        if existing is None:
            return 0  # taken meanwhile; the next pass files the message afresh
        merged, added = _merged(existing, raw)
        done = self._merge(
            keys=[self.queue, entries, stats, digests, copies],
            args=[raw, entry.id, existing, merged, keys_digest(_decode(merged).items), added],
        )
        return int(done)

    def depth(self) -> int:
        """Entries waiting for an operator."""
        self.absorb()
        return int(self.redis.hlen(self._key("entries")))

    def stats(self) -> tuple[int, int, float | None]:
        """(entries, keys, arrival time of the oldest entry) without decoding any entry."""
        self.absorb()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self._key("entries"))
        pipe.hget(self._key("stats"), "keys")
        pipe.zrange(self._key("order"), 0, 0, withscores=True)
        count, keys, oldest = pipe.execute()
        return int(count), int(keys or 0), float(oldest[0][1]) if oldest else None

    def entries(self, *, run: str | None = None, target: str | None = None) -> list[Entry]:
        """Entries oldest first, all of them or those of one run or target."""
        self.absorb()
        if run is not None or target is not None:
            members = self.redis.smembers(
                self._key("run", run) if run is not None else self._key("target", target or "")
            )
            ids = [as_text(m) for m in members]
            scores = self.redis.zmscore(self._key("order"), ids) if ids else []
            ids = [i for _, i in sorted(zip((s or 0.0 for s in scores), ids, strict=True))]
        else:
            ordered: list[bytes] = self.redis.zrange(self._key("order"), 0, -1)  # type: ignore[assignment]
            ids = [as_text(m) for m in ordered]
        return self._load(ids)

    def _load(self, ids: Sequence[str]) -> list[Entry]:
        found: list[Entry] = []
        for start in range(0, len(ids), _LOAD_CHUNK):
            chunk = list(ids[start : start + _LOAD_CHUNK])
            pipe = self.redis.pipeline(transaction=False)
            pipe.hmget(self._key("entries"), chunk)
            pipe.hmget(self._key("copies"), chunk)
            raws, copies = pipe.execute()
            for entry_id, raw, extra in zip(chunk, raws, copies, strict=True):
                if raw is not None:
                    entry = _decode(raw)
                    found.append(
                        dataclasses.replace(entry, id=entry_id, copies=1 + int(extra or 0))
                    )
        return found

    def select(
        self,
        *,
        ids: Sequence[str] = (),
        run: str | None = None,
        target: str | None = None,
        error: str | None = None,
        everything: bool = False,
    ) -> list[Entry]:
        """Entries matching every given selector."""
        if ids:
            self.absorb()
            entries = self._load(ids)
            missing = sorted(set(ids) - {e.id for e in entries})
            if missing:
                raise DeadLetterError(f"no dead-letter entry {', '.join(missing)}; see 'dlq list'")
        elif not (run or target or error or everything):
            raise DeadLetterError("say which entries: --all, entry ids, --run, --target or --error")
        else:
            entries = self.entries(run=run, target=target if run is None else None)
        if run:
            entries = [e for e in entries if e.run_id == run]
        if target:
            entries = [e for e in entries if e.target == target]
        if error:
            entries = [e for e in entries if error in e.codes]
        return entries

    def get(self, entry_id: str) -> Entry:
        return self.select(ids=[entry_id])[0]

    def redrive_one(self, entry: Entry) -> bool:
        """Move one entry back onto the work queue; False when it was no longer there.

        Callers check first that it may go (see :mod:`digest_cleanup.pipeline.redrive`).
        """
        if entry.payload is None:
            raise DeadLetterError(f"{entry.id} is a poison entry and cannot be redriven")
        n = self._redrive(
            keys=[
                *self._index_keys(entry.run_id, entry.target),
                self.work_queue,
                self.runs.run_key(entry.run_id),
                self.runs.run_key(entry.run_id, "pending"),
            ],
            args=[
                entry.id,
                entry.key_count,
                time.time(),
                entry.payload.batch_id,
                _iso_now(),
                self.work_exchange,
                self.work_routing_key,
                FAILED_RUN_NOTE,
            ],
        )
        return bool(int(n))

    def purge(self, entries: Iterable[Entry], command: str) -> list[dict[str, Any]]:
        """Remove entries for good, leaving an audit record of each; returns the records."""
        records = []
        for entry in entries:
            record = {
                "action": "purge",
                "at": _iso_now(),
                "by": who(),
                "command": command,
                "entry": entry.as_dict(),
            }
            removed = self._purge(
                keys=[*self._index_keys(entry.run_id, entry.target), self._audit_key],
                args=[entry.id, json.dumps(record), entry.key_count],
            )
            if int(removed):
                records.append(record)
        return records

    @property
    def _audit_key(self) -> str:
        return f"{self.key_prefix}:audit"

    def log_action(self, record: Mapping[str, Any]) -> None:
        """Add an operator's action (an abort, say) to the audit log purges write to."""
        self.redis.lpush(self._audit_key, json.dumps(record))

    def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        raw = self.redis.lrange(self._audit_key, 0, limit - 1)
        return [json.loads(r) for r in raw]


def _decode(raw: bytes | str) -> Entry:
    """The entry a queued message holds; one that does not decode is kept as ``undecodable``."""
    try:
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        entry_id = str(message["headers"]["id"])
    except (ValueError, KeyError, TypeError):
        digest = hashlib.sha256(raw if isinstance(raw, bytes) else raw.encode()).hexdigest()
        return Entry(
            id=f"undecodable-{digest[:12]}",
            payload=None,
            raw_kwargs={"dead_letter": {"reason": "undecodable", "item_count": 0,
                                        "message": "the queued message is not JSON Celery knows"}},
        )  # fmt: skip
    try:
        payload: BatchPayload | None = BatchPayload.from_message(kwargs)
    except Exception:
        payload = None
    if payload is not None and not payload.dead_letter:
        payload = None
    return Entry(
        id=entry_id, payload=payload, raw_kwargs=kwargs if isinstance(kwargs, dict) else {}
    )


def _clip(base: str, rest: str) -> str:
    """``base + rest`` cut to :data:`MAX_ITEM_LENGTH`, without building the whole string."""
    if len(base) + len(rest) <= MAX_ITEM_LENGTH:
        return base + rest
    whole = len(base) + len(rest)
    return (base[:MAX_ITEM_LENGTH] + rest[:MAX_ITEM_LENGTH])[:MAX_ITEM_LENGTH] + (
        f"...({whole} characters)"
    )


def _iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def who() -> str:
    """``user@host`` of the operator, for audit records."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
