"""The dead-letter queue: batches that still failed, waiting for an operator.

Redis has no native dead-lettering, so an entry is an ordinary Celery message
for ``digest_cleanup.delete_batch`` published to a queue no worker consumes.
Its body is already the *redrive* of the failed items (next generation, first
attempt), plus a ``dead_letter`` section saying why.  So:

* listing is ``LRANGE`` (peek: nothing consumed, nothing reordered);
* redriving moves the message back onto the work queue, one entry per Lua
  script call, so a redrive that crashes halfway leaves each entry in exactly
  one of the two queues, never in neither;
* the run's counters move in the same script (``redriven`` up,
  ``dead_lettered`` down, the run back to ``running``), and the redriven batch
  folds its outcome into its original run.
"""

from __future__ import annotations

import base64
import dataclasses
import getpass
import json
import socket
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from digest_cleanup.batches import MAX_ITEM_LENGTH, BatchPayload
from digest_cleanup.errors import DeadLetterError
from digest_cleanup.kinds import ItemResult
from digest_cleanup.runs import RunStore

#: What a failed run's message gains when its dead letters are redriven.
FAILED_RUN_NOTE = (
    "Its dead letters were redriven, but the run stays failed: trigger a new run to "
    "delete what it never listed."
)
#: Items of a poison message kept in its entry; the rest are counted, not stored.
POISON_ITEMS_KEPT = 50

_REDRIVE_LUA = """
local dlq, work, run, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, n, now_epoch, batch, now = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local exchange, routing_key = ARGV[6], ARGV[7]
local moved = 0
for _, raw in ipairs(redis.call('LRANGE', dlq, 0, -1)) do
  local ok, msg = pcall(cjson.decode, raw)
  if ok and type(msg) == 'table' and msg.headers and msg.headers.id == id then
    redis.call('LREM', dlq, 1, raw)
    if moved == 0 then
      -- kombu restores an unacknowledged message to the queue its delivery_info
      -- names, so point it at the work queue or a killed worker would send it back here.
      msg.properties.delivery_info.exchange = exchange
      msg.properties.delivery_info.routing_key = routing_key
      redis.call('LPUSH', work, cjson.encode(msg))
    end
    moved = moved + 1
  end
end
if moved > 0 and n > 0 and redis.call('EXISTS', run) == 1 then
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
return moved
"""

_PURGE_LUA = """
local dlq, audit = KEYS[1], KEYS[2]
local removed = 0
for _, raw in ipairs(redis.call('LRANGE', dlq, 0, -1)) do
  local ok, msg = pcall(cjson.decode, raw)
  if ok and type(msg) == 'table' and msg.headers and msg.headers.id == ARGV[1] then
    removed = removed + redis.call('LREM', dlq, 1, raw)
  end
end
if removed > 0 then redis.call('LPUSH', audit, ARGV[2]) end
return removed
"""


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


def make_poison_entry(task_id: str, raw: Any, reason: str, message: str) -> dict[str, Any]:
    """An entry for a message that never decoded as a batch; kept small and not redrivable."""
    raw_map: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    rest: list[Any] = raw_map["rest"] if isinstance(raw_map.get("rest"), list) else []
    base: str = raw_map["base"] if isinstance(raw_map.get("base"), str) else ""
    # Clipped: a forged message may carry megabytes per item, and the entry must stay small.
    items = [_clip(base, r) for r in rest[:POISON_ITEMS_KEPT] if isinstance(r, str)]
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
        self._redrive = client.register_script(_REDRIVE_LUA)
        self._purge = client.register_script(_PURGE_LUA)

    def depth(self) -> int:
        return int(self.redis.llen(self.queue))

    def entries(self) -> list[Entry]:
        """Every entry, oldest first, duplicates folded into one (``copies`` > 1)."""
        seen: dict[str, Entry] = {}
        # LPUSH publishes, so the oldest message is last: read back to front.
        for raw in reversed(self.redis.lrange(self.queue, 0, -1)):
            entry = _decode(raw)
            if entry is None:
                continue
            if entry.id in seen:
                seen[entry.id] = dataclasses.replace(
                    seen[entry.id], copies=seen[entry.id].copies + 1
                )
            else:
                seen[entry.id] = entry
        return list(seen.values())

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
        entries = self.entries()
        if ids:
            known = {e.id for e in entries}
            missing = [i for i in ids if i not in known]
            if missing:
                raise DeadLetterError(f"no dead-letter entry {', '.join(missing)}; see 'dlq list'")
            entries = [e for e in entries if e.id in ids]
        elif not (run or target or error or everything):
            raise DeadLetterError("say which entries: --all, entry ids, --run, --target or --error")
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

        Callers check first that it may go (see :mod:`digest_cleanup.redrive`).
        """
        if entry.payload is None:
            raise DeadLetterError(f"{entry.id} is a poison entry and cannot be redriven")
        n = self._redrive(
            keys=[
                self.queue,
                self.work_queue,
                self.runs.run_key(entry.run_id),
                self.runs.run_key(entry.run_id, "pending"),
            ],
            args=[
                entry.id,
                len(entry.items),
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
                keys=[self.queue, f"{self.key_prefix}:audit"], args=[entry.id, json.dumps(record)]
            )
            if int(removed):
                records.append(record)
        return records

    def log_action(self, record: Mapping[str, Any]) -> None:
        """Add an operator's action (an abort, say) to the audit log purges write to."""
        self.redis.lpush(f"{self.key_prefix}:audit", json.dumps(record))

    def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        raw = self.redis.lrange(f"{self.key_prefix}:audit", 0, limit - 1)
        return [json.loads(r) for r in raw]


def _decode(raw: bytes | str) -> Entry | None:
    try:
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        entry_id = str(message["headers"]["id"])
    except (ValueError, KeyError, TypeError):
        return None
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
