"""Dead-letter records: an entry on its way to the queue, and an entry as ops read it.

An entry is an ordinary Celery message for ``digest_cleanup.delete_batch`` whose
body is already the *redrive* of the failed keys (next generation, first
attempt), plus a ``dead_letter`` section saying why.  A message that never
decoded as a batch becomes a *poison* entry: kept small, and not redrivable.
The queue that holds them is :mod:`digest_cleanup.store.dead_letters`.
"""

from __future__ import annotations

import base64
import dataclasses
import getpass
import hashlib
import json
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from digest_cleanup.clock import now_iso
from digest_cleanup.kinds import KeyResult
from digest_cleanup.model.batches import MAX_KEY_LENGTH, MAX_MESSAGE_KEYS, BatchPayload

#: Characters of a poison message's keys kept in its entry; past them the rest are
#: counted, not stored.  A genuine batch is at most 1,000 keys of 1,024 characters, so
#: it is always kept whole; only a forged message can be larger.
POISON_CHARS_KEPT = 2 * MAX_MESSAGE_KEYS * MAX_KEY_LENGTH
#: Keys longer than any key that a poison entry shows, clipped; the rest are counted.
POISON_OVERSIZED_SHOWN = 50


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A dead-letter entry on its way to the dead-letter queue."""

    #: The entry's id, deterministic for a batch attempt (see :func:`make_entry`).
    entry_id: str
    #: The message body: a batch message a redrive sends back as it is, or a poison record.
    body: dict[str, Any]
    #: What Flower shows for it.
    label: str


#: An entry's fields as ``dlq show`` and the console list them, in that order.
ENTRY_FIELDS = (
    "id",
    "run_id",
    "target",
    "batch_id",
    "reason",
    "message",
    "key_count",
    "attempts",
    "first_failure_at",
    "last_failure_at",
    "redrivable",
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
        """Why the entry is here; empty for a message whose ``dead_letter`` is not a record."""
        if self.payload:
            return self.payload.dead_letter
        info = self.raw_kwargs.get("dead_letter", {})
        return info if isinstance(info, Mapping) else {}

    @property
    def run_id(self) -> str:
        return self.payload.run_id if self.payload else str(self.raw_kwargs.get("run_id", ""))

    @property
    def target(self) -> str:
        return self.payload.target if self.payload else str(self.raw_kwargs.get("target", ""))

    @property
    def keys(self) -> list[str]:
        if self.payload:
            return self.payload.keys
        items = self.info.get("items", [])
        return [str(i) for i in items] if isinstance(items, list) else []

    @property
    def key_count(self) -> int:
        """Keys the entry stands for (a poison entry keeps fewer than it counts).

        A batch entry counts the keys it holds, never a number its message states: a
        forged count must not move the run's counters when it is redriven.
        """
        if self.payload is not None:
            return len(self.payload.keys)
        count = self.info.get("item_count", len(self.keys))
        return count if isinstance(count, int) and count >= 0 else len(self.keys)

    @property
    def errors(self) -> Mapping[str, list[str]]:
        """``[code, message]`` by key, leaving out anything that is not that shape."""
        errors = self.info.get("errors", {})
        if not isinstance(errors, Mapping):
            return {}
        return {
            str(k): [str(e[0]), str(e[1])]
            for k, e in errors.items()
            if isinstance(e, list | tuple) and len(e) >= 2
        }

    @property
    def codes(self) -> set[str]:
        return {e[0] for e in self.errors.values()} | {str(self.info.get("reason", ""))}

    def as_dict(self) -> dict[str, Any]:
        info = dict(self.info)
        info.pop("errors", None)
        errors = self.errors
        return {
            "id": self.id,
            "run_id": self.run_id,
            "target": self.target,
            "batch_id": self.payload.batch_id if self.payload else info.get("batch_id", ""),
            "reason": info.get("reason", ""),
            "message": info.get("message", ""),
            "key_count": self.key_count,
            "keys": [
                {
                    "key": key,
                    "code": errors.get(key, [info.get("reason", ""), ""])[0],
                    "message": errors.get(key, ["", info.get("message", "")])[1],
                }
                for key in self.keys
            ],
            "attempts": info.get("attempts", 0),
            "first_failure_at": info.get("first_failure_at", ""),
            "last_failure_at": info.get("last_failure_at", ""),
            "redrivable": self.payload is not None,
            "copies": self.copies,
        }


def make_entry(
    payload: BatchPayload,
    dead: Mapping[str, KeyResult],
    reason: str,
    message: str = "",
    *,
    entry_id: str = "",
) -> DeadLetter:
    """The dead-letter entry for the failed keys of one attempt: a ready-made redrive.

    ``entry_id`` defaults to the attempt's own (``dl-BATCH-gGaA``); a message the run
    never published gets one of its own, so it never merges into a real entry.
    """
    now = now_iso("seconds")
    errors = {key: [r.code, r.message[:500]] for key, r in dead.items()}
    if not message:
        counts = Counter(r.code for r in dead.values())
        message = ", ".join(f"{code} x{n}" for code, n in counts.most_common())
    entry_id = entry_id or f"dl-{payload.batch_id}-g{payload.generation}a{payload.attempt}"
    entry = payload.subset(
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
    return DeadLetter(entry_id, entry.to_message(), entry.describe())


def make_poison_entry(task_id: str, raw: Any, reason: str, message: str) -> DeadLetter:
    """An entry for a message that never decoded as a batch; kept small and not redrivable."""
    raw_map: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    rest: list[Any] = raw_map["rest"] if isinstance(raw_map.get("rest"), list) else []
    base: str = raw_map["base"] if isinstance(raw_map.get("base"), str) else ""
    # Clipped: a forged message may carry megabytes per key, and the entry must stay small.
    keys: list[str] = []
    budget, oversized = POISON_CHARS_KEPT, 0
    for r in rest:
        if not isinstance(r, str):
            continue
        if len(base) + len(r) > MAX_KEY_LENGTH:
            # Longer than any S3 key, so not a key: a few are shown, clipped, as evidence.
            oversized += 1
            if oversized > POISON_OVERSIZED_SHOWN:
                continue
        key = _clip(base, r)
        budget -= len(key)
        if budget < 0:
            break
        keys.append(key)
    now = now_iso("seconds")
    entry_id = f"dl-poison-{task_id}"
    body = {
        "run_id": str(raw_map.get("run_id", ""))[:200],
        "target": str(raw_map.get("target", ""))[:200],
        "dead_letter": {
            "entry_id": entry_id,
            "reason": reason,
            "message": message[:500],
            "items": keys,
            "item_count": len(rest),
            "errors": {},
            "attempts": 1,
            "first_failure_at": now,
            "last_failure_at": now,
            "batch_id": str(raw_map.get("batch_id", ""))[:200],
        },
    }
    return DeadLetter(entry_id, body, f"poison {reason}")


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


def keys_digest(keys: Iterable[str]) -> str:
    """A short digest of an entry's keys: copies share it, other keys do not."""
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


def decode_entry(raw: bytes | str) -> Entry:
    """The entry a queued message holds; one that does not decode is kept as ``undecodable``."""
    try:
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        entry_id = str(message["headers"]["id"])
    # AttributeError: JSON of the wrong shape (a string where an object belongs).
    except (ValueError, KeyError, TypeError, AttributeError):
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
    """``base + rest`` cut to :data:`MAX_KEY_LENGTH`, without building the whole string."""
    if len(base) + len(rest) <= MAX_KEY_LENGTH:
        return base + rest
    whole = len(base) + len(rest)
    return (base[:MAX_KEY_LENGTH] + rest[:MAX_KEY_LENGTH])[:MAX_KEY_LENGTH] + (
        f"...({whole} characters)"
    )


def who() -> str:
    """``user@host`` of the operator, for audit records."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
