"""A batch and one attempt at it: the family of types every attempt goes through.

* :class:`BatchPayload`: the message a sweep (or a retry, or a redrive) sends;
* :class:`Decision`: what one attempt decided for each key (deleted, skipped,
  retried, dead-lettered);
* :class:`BatchRecord`: what the run store records of the attempt, once;
* :class:`BatchReport`: the small summary the task returns and logs.

A dead-lettered attempt becomes a :class:`~digest_cleanup.model.dead_letters.DeadLetter`,
whose body is the next :class:`BatchPayload`.

A batch carries up to ``batch_size`` keys, compressed by their common prefix
(500 digest keys share most of their path, so this roughly halves a message),
with each key's delete condition (its listed ETag, for S3) and the digest of
the target's scope when it was listed.
Its id is deterministic (``RUN-bNNNNN``), and every attempt is claimed as
``batch / generation / attempt`` so a duplicate delivery counts nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from digest_cleanup.errors import PoisonMessage
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.settings import Settings

#: The most keys a batch message may carry, whatever the target says: a larger
#: message is poison (a forged or corrupted one), never split and deleted.
MAX_MESSAGE_KEYS = 1000
#: The longest key accepted in a message (S3 keys are at most 1024 bytes).
MAX_KEY_LENGTH = 1024
#: Bytes of SHA-256 kept per key in a published batch's digest (see :func:`entry_digests`):
#: 128 bits, so no forger finds a second key and condition that match one of a batch's.
ENTRY_DIGEST_BYTES = 16


@dataclasses.dataclass(frozen=True)
class BatchPayload:
    """The JSON body of a batch task."""

    run_id: str
    target: str
    batch_id: str
    seq: int
    cutoff: str
    keys: list[str]
    attempt: int = 0
    generation: int = 0
    published_at: float = 0.0
    #: Errors seen on earlier attempts, by key: ``[code, message]``.
    failures: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    first_failure_at: str = ""
    #: Present on a dead-letter entry: why it is there, and its id.
    dead_letter: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The run incarnation this batch belongs to: a batch from before a Redis restart or
    #: a run restart carries an old token and is refused rather than counted in a new run.
    run_token: str = ""
    #: One delete condition per key (see :class:`~digest_cleanup.kinds.Page`), or none.
    conditions: list[str] = dataclasses.field(default_factory=list)
    #: The digest of the target's scope when the batch was listed; a worker whose
    #: target differs now refuses the batch (``target_changed``).
    scope: str = ""

    @property
    def claim(self) -> str:
        """The key that makes recording this attempt happen once.

        A redrive's names the entry it came from: two entries of one batch (dead-lettered
        by different attempts) are redriven as the same generation, and must not take
        each other for a duplicate.
        """
        claim = f"{self.batch_id}/g{self.generation}/a{self.attempt}"
        origin = self.dead_letter.get("entry_id") if self.generation else None
        return f"{claim}/{origin}" if isinstance(origin, str) and origin else claim

    def subset(self, keys: Sequence[str], **changes: Any) -> BatchPayload:
        """The same batch for some of its keys, each keeping its own condition."""
        by_key = dict(zip(self.keys, self.conditions, strict=True)) if self.conditions else {}
        conditions = [by_key[i] for i in keys] if by_key else []
        return dataclasses.replace(self, keys=list(keys), conditions=conditions, **changes)

    def cutoff_datetime(self) -> datetime:
        return datetime.fromisoformat(self.cutoff)

    def describe(self, of: str = "") -> str:
        """A short, identifier-free label for Flower and logs.

        ``of`` is the run's batch count when known (see :func:`batch_total`):
        ``statements 2026-10-23 batch 17/240 (500 keys)``.
        """
        seq = f"{self.seq}/{of}" if of else str(self.seq)
        label = f"{self.target} {self.cutoff[:10]} batch {seq} ({len(self.keys)} keys)"
        if self.generation:
            label += f" redrive {self.generation}"
        if self.attempt:
            label += f" attempt {self.attempt + 1}"
        return label

    def to_message(self) -> dict[str, Any]:
        """Encode for the wire, folding the keys' common prefix.

        Field by field rather than :func:`dataclasses.asdict`, which deep-copies
        every key string: the sweep encodes every batch of a run.  The two
        dicts are copied whole, so a caller that edits the message leaves the
        payload be.
        """
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["failures"] = {k: list(v) for k, v in self.failures.items()}
        data["dead_letter"] = copy.deepcopy(self.dead_letter)
        keys = data.pop("keys")
        data["conditions"] = list(self.conditions)
        # Character-wise on purpose: keys share more than whole path segments.
        base = os.path.commonprefix(keys) if len(keys) > 1 else ""  # noqa: RUF071
        data["base"] = base
        data["rest"] = [i[len(base) :] for i in keys]
        return {k: v for k, v in data.items() if v not in ({}, "", []) or k in ("base", "rest")}

    @classmethod
    def from_message(cls, raw: Mapping[str, Any]) -> BatchPayload:
        """Decode and validate a message; one that can never work raises :class:`PoisonMessage`."""
        if not isinstance(raw, Mapping):
            raise PoisonMessage("malformed", f"body is {type(raw).__name__}, not an object")
        try:
            base, rest = raw["base"], raw["rest"]
            if not isinstance(base, str) or not isinstance(rest, list):
                raise TypeError("base must be a string and rest a list")
            if len(rest) > MAX_MESSAGE_KEYS:
                raise PoisonMessage(
                    "too_many_keys",
                    f"{len(rest)} keys; one delete request takes at most {MAX_MESSAGE_KEYS}",
                )
            if not all(isinstance(r, str) for r in rest):
                raise TypeError("every key must be a string")
            # Measured before joining: a forged 10 MB base joined to 1000 rests is 10 GB.
            if any(len(base) + len(r) > MAX_KEY_LENGTH for r in rest):
                raise TypeError(f"a key is longer than {MAX_KEY_LENGTH} characters")
            keys = [base + r for r in rest]
            fields = {f.name for f in dataclasses.fields(cls)} - {"keys"}
            unknown = set(raw) - fields - {"base", "rest"}
            if unknown:
                raise TypeError(f"unknown fields {sorted(unknown)}")
            payload = cls(keys=keys, **{k: v for k, v in raw.items() if k in fields})
            for name, typ in (("run_id", str), ("target", str), ("batch_id", str), ("cutoff", str)):
                if not isinstance(getattr(payload, name), typ) or not getattr(payload, name):
                    raise TypeError(f"{name} must be a non-empty string")
            if not keys:
                raise TypeError("a batch holds at least one key")
            whole = (payload.attempt, payload.generation, payload.seq)
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in whole):
                raise TypeError("attempt, generation and seq must be whole numbers")
            if not isinstance(payload.published_at, int | float) or isinstance(
                payload.published_at, bool
            ):
                raise TypeError("published_at must be a number")
            if not isinstance(payload.first_failure_at, str):
                raise TypeError("first_failure_at must be a string")
            if not isinstance(payload.failures, dict) or not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v)
                for v in payload.failures.values()
            ):
                raise TypeError("failures must map keys to [code, message]")
            if not isinstance(payload.dead_letter, dict):
                raise TypeError("dead_letter must be an object")
            conditions = payload.conditions
            if not isinstance(conditions, list) or not all(isinstance(c, str) for c in conditions):
                raise TypeError("conditions must be a list of strings")
            if conditions and len(conditions) != len(keys):
                raise TypeError(f"{len(conditions)} conditions for {len(keys)} keys")
            payload.cutoff_datetime()
        except PoisonMessage:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise PoisonMessage("malformed", f"not a batch message: {exc}") from exc
        return payload


@dataclasses.dataclass
class Decision:
    """What one attempt decided, before anything is published or recorded."""

    deleted: int = 0
    skipped: int = 0
    #: The keys left alone on purpose (rewritten since listing), with why.
    skipped_keys: list[KeyResult] = dataclasses.field(default_factory=list)
    #: Keys to try again, with the error they failed with.
    retry: dict[str, KeyResult] = dataclasses.field(default_factory=dict)
    #: Keys to dead-letter, with the error they failed with.
    dead: dict[str, KeyResult] = dataclasses.field(default_factory=dict)
    #: The longest ``Retry-After`` any failing key asked for.
    retry_after: float | None = None

    def codes(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for result in (*self.retry.values(), *self.dead.values()):
            counts[result.code] = counts.get(result.code, 0) + 1
        return counts


def decide(results: Sequence[KeyResult], attempt: int, max_retries: int) -> Decision:
    """Sort per-key results into done, retry and dead letter."""
    out = Decision()
    for result in results:
        if result.outcome is Outcome.DELETED:
            out.deleted += 1
        elif result.outcome is Outcome.SKIPPED:
            out.skipped += 1
            out.skipped_keys.append(result)
        elif result.outcome is Outcome.TRANSIENT and attempt < max_retries:
            out.retry[result.key] = result
            if result.retry_after is not None:
                out.retry_after = max(out.retry_after or 0.0, result.retry_after)
        else:
            out.dead[result.key] = result
    return out


def backoff(attempt: int, settings: Settings, retry_after: float | None = None) -> float:
    """Seconds before retry ``attempt + 1``: exponential with full jitter.

    ``Retry-After`` sets a floor when the store sent one.  The result never
    exceeds :attr:`Settings.effective_retry_cap`, which keeps every countdown
    well inside the visibility timeout (a longer one makes Redis redeliver).
    """
    ceiling = min(settings.effective_retry_cap, settings.retry_base * 2**attempt)
    delay = random.uniform(0, ceiling)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, settings.effective_retry_cap)


def entry_digests(run_token: str, keys: Sequence[str], conditions: Sequence[str]) -> bytes:
    """What the run store keeps of a published batch: the digest of each key and condition.

    A worker deletes a message's keys only when each of them, with its condition, is
    one of these (see :func:`~digest_cleanup.pipeline.batch_checks.check_batch`); a
    retry or a redrive carries a subset of its batch, so membership is what counts.
    """
    return b"".join(_entry_digests(run_token, keys, conditions))


def unpublished_keys(published: bytes, payload: BatchPayload) -> list[str]:
    """The keys of ``payload`` that its batch, as published, did not hold with that condition."""
    size = ENTRY_DIGEST_BYTES
    known = {published[i : i + size] for i in range(0, len(published), size)}
    digests = _entry_digests(payload.run_token, payload.keys, payload.conditions)
    return [key for key, digest in zip(payload.keys, digests, strict=True) if digest not in known]


def _entry_digests(run_token: str, keys: Sequence[str], conditions: Sequence[str]) -> list[bytes]:
    """SHA-256 of each key and condition, bound to the run incarnation's token.

    The key's length comes first, so no key and condition run into another pair's;
    the token makes a digest of one incarnation vouch for no message of another.
    """
    seed = hashlib.sha256(run_token.encode() + b"\0")
    out = []
    for key, condition in zip(keys, conditions or [""] * len(keys), strict=True):
        h = seed.copy()
        h.update(f"{len(key)}:{key}{condition}".encode(errors="surrogatepass"))
        out.append(h.digest()[:ENTRY_DIGEST_BYTES])
    return out


def batch_id(run_id: str, seq: int) -> str:
    return f"{run_id}-b{seq:05d}"


def batch_total(run: Mapping[str, str] | None, seq: int) -> str:
    """The run's batch count for a label: exact once the sweep is done, ``~N`` before.

    While the sweep streams, only the guard pass's count of expired keys is
    known, so the total is an estimate and says so; without one it is left out.
    """
    if not run:
        return ""
    if run.get("sweep_done") == "1":
        return run.get("batches", "")
    seen, size = int(run.get("expired_seen") or 0), int(run.get("batch_size") or 0)
    estimate = -(-seen // size) if size else 0
    return f"~{estimate}" if estimate >= seq else ""


@dataclasses.dataclass(frozen=True, slots=True)
class BatchRecord:
    """What one batch attempt did, as recorded against its run."""

    batch_id: str
    claim: str
    deleted: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    #: 1 when this attempt published a retry for some of its keys.
    retries: int = 0
    #: Failing keys by error code (retried or dead-lettered).
    codes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: Error codes of the keys this attempt retried, for the retries-by-code metric.
    retried_codes: Sequence[str] = ()
    #: True when nothing of this batch is left in flight after this attempt.
    terminal: bool = True
    #: False for a redriven batch, which must not count as another batch done.
    first_generation: bool = True
    #: Seconds from publish to acknowledgement, for the latency histogram.
    latency: float | None = None
    #: Wall seconds of the whole attempt and of the store's delete call, with the key
    #: count: the service times capacity planning and the benchmark read.
    service_seconds: float | None = None
    delete_seconds: float = 0.0
    keys: int = 0
    #: The keys this attempt left alone on purpose, as ``(key, code, message)``.
    skipped_keys: Sequence[tuple[str, str, str]] = ()


@dataclasses.dataclass
class BatchReport:
    """The small JSON-able summary a batch task returns and logs."""

    status: str
    batch_id: str = ""
    run_id: str = ""
    target: str = ""
    deleted: int = 0
    skipped: int = 0
    retrying: int = 0
    dead_lettered: int = 0
    entry_id: str = ""
    reason: str = ""
    countdown: float = 0.0
    recorded: str = ""
    delete_seconds: float = 0.0
    #: Seconds the batch waited for its target's delete budget before sending.
    budget_wait: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in ("", 0, 0.0)}
