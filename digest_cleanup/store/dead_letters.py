"""The dead-letter queue: batches that still failed, waiting for an operator.

Redis has no native dead-lettering, so an entry (see
:mod:`digest_cleanup.model.dead_letters`) is an ordinary Celery message
published to a queue no worker consumes.

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
  ``dead_lettered`` down, the run back to ``running``), through the run part's
  ``count_redrive`` (``scripts/run_redrive.lua``), and the redriven batch folds
  its outcome into its original run;
* a message delivered twice is one entry with ``copies`` 2; two messages with
  one id but different keys (a redelivery that failed other keys) are merged into
  one entry, keys, conditions and errors; a message that cannot be merged is kept
  as an entry of its own, ``ID~HASH``, so one bad message never blocks a read.

Nothing is ever dropped to keep the queue small: ``CLEANUP_DLQ_MAX_ENTRIES`` and
``CLEANUP_DLQ_RETENTION_DAYS`` only raise an alert when reached.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from digest_cleanup.clock import now_iso
from digest_cleanup.errors import DeadLetterError
from digest_cleanup.model.dead_letters import Entry, decode_entry, keys_digest, who
from digest_cleanup.store.connection import as_text
from digest_cleanup.store.keys import Keys
from digest_cleanup.store.scripts import Script

logger = logging.getLogger("digest_cleanup.dead_letter")

#: What a failed run's message gains when its dead letters are redriven.
FAILED_RUN_NOTE = (
    "Its dead letters were redriven, but the run stays failed: trigger a new run to "
    "delete what it never listed."
)
#: Queued messages one absorbing script call moves at most: 50 of 500 keys each keep
#: Redis busy for about 30 ms, a pause the workers sharing it do not notice.
_ABSORB_BATCH = 50
#: The index keys a merge changes (it leaves the arrival order and the per-run sets).
MERGED = ("entries", "stats", "digests", "copies")
#: Entries read from Redis per round trip when listing.
_LOAD_CHUNK = 500


class DeadLetterQueue:
    """List, show, redrive and purge entries; every change is atomic per entry."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        queue: str,
        work_queue: str,
        work_exchange: str = "",
        work_routing_key: str = "",
    ) -> None:
        self.client = client
        self.keys = keys
        self._key = keys.dead_letters
        self.queue = queue
        self.work_queue = work_queue
        self.work_exchange = work_exchange or work_queue
        self.work_routing_key = work_routing_key or work_queue
        #: The prefix of every key of the store.
        self.key_prefix = keys.prefix
        #: The audit log's key, which purges and operators' actions write to.
        self.audit_key = keys.audit()
        self._absorb = Script(client, "dead_letter_absorb.lua")
        self._absorb_indexed = Script(client, "dead_letter_absorb_indexed.lua")
        self._merge = Script(client, "dead_letter_merge.lua")
        self._redrive = Script(client, "dead_letter_redrive.lua")
        self._purge = Script(client, "dead_letter_purge.lua")

    def _index_keys(self, run_id: str, target: str) -> dict[str, str]:
        """The index keys one entry lives in, by their names in the scripts."""
        return {
            **self._shared_keys(),
            "by_run": self._key("run", run_id),
            "by_target": self._key("target", target),
        }

    def _shared_keys(self) -> dict[str, str]:
        """The index keys every entry shares."""
        return {
            name: self._key(name) for name in ("entries", "order", "copies", "stats", "digests")
        }

    def absorb(self) -> int:
        """Index every message workers published since the last read; returns how many.

        Each message moves only if it is still the oldest one queued, so two readers
        absorbing at once never index a message twice or lose one.  One entry per id:
        a copy (a redelivery that dead-lettered the same keys) is counted on it, and a
        message with the same id but other keys is merged into it, keys and all, so
        nothing is lost and one redrive still covers the batch.
        """
        moved = 0
        bulk_keys = {"queue": self.queue, **self._shared_keys()}
        while True:
            # Messages that carry their index headers move in bulk, inside Redis.
            step = int(self._absorb_indexed(
                keys=bulk_keys,
                args={"limit": _ABSORB_BATCH, "now": time.time(), "prefix": self._key()},
            ))  # fmt: skip
            moved += step
            raw = self.client.lindex(self.queue, -1)
            if raw is None:
                return moved
            if not step:
                moved += self._absorb_one(raw if isinstance(raw, bytes) else raw.encode())

    def _absorb_one(self, raw: bytes) -> int:
        """Index one message the bulk script left: no headers, or keys to merge."""
        entry = decode_entry(raw)
        # A poison message's digest is of its bytes, which need not even be UTF-8.
        whole = raw.decode("utf-8", "backslashreplace")
        digest = keys_digest(entry.keys) if entry.payload else keys_digest([whole])
        keys = {"queue": self.queue, **self._index_keys(entry.run_id, entry.target)}
        args: dict[str, str | int | float | bytes] = {
            "raw": raw, "id": entry.id, "now": time.time(), "key_count": entry.key_count,
            "digest": digest,
        }  # fmt: skip
        result = int(self._absorb(keys=keys, args=args))
        if result >= 0:
            return result
        existing: bytes | None = self.client.hget(keys["entries"], entry.id)  # type: ignore[assignment]
        if existing is None:
            return 0  # taken meanwhile; the next pass files the message afresh
        try:
            merged, added = _merged(existing, raw)
        except Exception as exc:
            # A message the merge cannot read would stay at the queue's tail and fail every
            # later read; filed under an id of its own instead, it is listed and can be purged.
            logger.warning("dead letter %s kept apart, not merged: %r", entry.id, exc)
            args["id"] = f"{entry.id}~{digest[:8]}"
            return max(0, int(self._absorb(keys=keys, args=args)))
        done = self._merge(
            keys={"queue": self.queue, **{k: keys[k] for k in MERGED}},
            args={
                "raw": raw,
                "id": entry.id,
                "existing": existing,
                "merged": merged,
                "digest": keys_digest(decode_entry(merged).keys),
                "added": added,
            },
        )
        return int(done)

    def depth(self) -> int:
        """Entries waiting for an operator."""
        self.absorb()
        return int(self.client.hlen(self._key("entries")))

    def stats(self) -> tuple[int, int, float | None]:
        """(entries, keys, arrival time of the oldest entry) without decoding any entry."""
        self.absorb()
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen(self._key("entries"))
        pipe.hget(self._key("stats"), "keys")
        pipe.zrange(self._key("order"), 0, 0, withscores=True)
        count, keys, oldest = pipe.execute()
        return int(count), int(keys or 0), float(oldest[0][1]) if oldest else None

    def entries(self, *, run: str | None = None, target: str | None = None) -> list[Entry]:
        """Entries oldest first, all of them or those of one run or target."""
        self.absorb()
        if run is not None or target is not None:
            members = self.client.smembers(
                self._key("run", run) if run is not None else self._key("target", target or "")
            )
            ids = [as_text(m) for m in members]
            scores = self.client.zmscore(self._key("order"), ids) if ids else []
            ids = [i for _, i in sorted(zip((s or 0.0 for s in scores), ids, strict=True))]
        else:
            ordered: list[bytes] = self.client.zrange(self._key("order"), 0, -1)  # type: ignore[assignment]
            ids = [as_text(m) for m in ordered]
        return self._load(ids)

    def _load(self, ids: Sequence[str]) -> list[Entry]:
        found: list[Entry] = []
        for start in range(0, len(ids), _LOAD_CHUNK):
            chunk = list(ids[start : start + _LOAD_CHUNK])
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(self._key("entries"), chunk)
            pipe.hmget(self._key("copies"), chunk)
            raws, copies = pipe.execute()
            for entry_id, raw, extra in zip(chunk, raws, copies, strict=True):
                if raw is not None:
                    entry = decode_entry(raw)
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

        Callers check first that it may go (see :mod:`digest_cleanup.ops.redrive`).
        """
        if entry.payload is None:
            raise DeadLetterError(f"{entry.id} is a poison entry and cannot be redriven")
        n = self._redrive(
            keys={
                **self._index_keys(entry.run_id, entry.target),
                "work": self.work_queue,
                # The run's keys its counts go back into, through the run part's fragment.
                "run": self.keys.run(entry.run_id),
                **{k: self.keys.run(entry.run_id, k) for k in ("pending", "redriven", "chains")},
            },
            args={
                "id": entry.id,
                "key_count": entry.key_count,
                "now_epoch": time.time(),
                "batch": entry.payload.batch_id,
                "now": now_iso("seconds"),
                "exchange": self.work_exchange,
                "routing_key": self.work_routing_key,
                "failed_note": FAILED_RUN_NOTE,
            },
        )
        return bool(int(n))

    def purge(self, entries: Iterable[Entry], command: str) -> list[dict[str, Any]]:
        """Remove entries for good, leaving an audit record of each; returns the records."""
        records = []
        for entry in entries:
            record = {
                "action": "purge",
                "at": now_iso("seconds"),
                "by": who(),
                "command": command,
                "entry": entry.as_dict(),
            }
            removed = self._purge(
                keys={**self._index_keys(entry.run_id, entry.target), "audit": self.audit_key},
                args={"id": entry.id, "record": json.dumps(record), "key_count": entry.key_count},
            )
            if int(removed):
                records.append(record)
        return records

    def log_action(self, record: Mapping[str, Any]) -> None:
        """Add an operator's action (an abort, say) to the audit log purges write to."""
        self.client.lpush(self.audit_key, json.dumps(record))

    def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        raw = self.client.lrange(self.audit_key, 0, limit - 1)
        return [json.loads(r) for r in raw]


def _merged(existing: bytes, incoming: bytes) -> tuple[str, int]:
    """``existing`` with the keys of ``incoming`` it lacks, and how many were added.

    Both are dead letters of one batch attempt (a redelivery that failed other keys);
    the entry keeps its own errors and adds the newcomer's.  Each key keeps the
    condition it was listed with, whichever message brought it.  Raises when only one
    is a batch message: the caller keeps the newcomer as an entry of its own.
    """
    message = json.loads(existing)
    args, _, embed = json.loads(base64.b64decode(message["body"]))
    old, new = decode_entry(existing).payload, decode_entry(incoming).payload
    if old is None and new is None:
        return existing.decode(), 0  # two poison records of one message: a copy
    if old is None or new is None:
        raise ValueError("a batch and a poison record share an id, so no keys merge")
    have = set(old.keys)
    extra = [i for i in new.keys if i not in have]
    keys = [*old.keys, *extra]
    conditions: list[str] = []
    if old.conditions or new.conditions:
        listed = dict(zip(new.keys, new.conditions, strict=True)) if new.conditions else {}
        listed.update(zip(old.keys, old.conditions, strict=True) if old.conditions else ())
        conditions = [listed.get(i, "") for i in keys]
    payload = dataclasses.replace(
        old,
        keys=keys,
        conditions=conditions,
        dead_letter={
            **old.dead_letter,
            "errors": {**new.dead_letter.get("errors", {}), **old.dead_letter.get("errors", {})},
        },
    )
    body = json.dumps([args, payload.to_message(), embed]).encode()
    message["body"] = base64.b64encode(body).decode()
    return json.dumps(message), len(extra)
