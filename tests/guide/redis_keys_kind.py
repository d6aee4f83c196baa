"""A target kind for Redis keys that nobody has read or written for a while.

A key is one matching the target's ``pattern``.  It has expired when
``OBJECT IDLETIME`` says it was last touched before the cutoff, and it is
deleted with ``UNLINK``.

How it maps onto the seam:

* :meth:`RedisKeysKind.scan` walks the keyspace with ``SCAN MATCH``.  SCAN's own
  cursor comes in hash-table order and may return a key twice, so it cannot be a
  resumable, count-once position.  Each scan collects every matching name in one
  pass, sorts them, and pages through the sorted list: ``Page.cursor`` is a
  page's last key, and ``start_after`` skips the names up to it.  The price is
  one full SCAN, and every matching name held in memory, per scan call (the sweep
  calls it once per slice);
* :meth:`RedisKeysKind.delete` runs one Lua script per batch.  The script checks
  each key's idle time and unlinks it in a single atomic step, so a key read
  since the sweep is reported SKIPPED and kept;
* keys that are not UTF-8 are never listed: a key is text.

Limits: it does not support Redis Cluster (SCAN sees one node, and a script's keys
must share a slot).  Under an LFU ``maxmemory-policy`` Redis keeps no idle times,
so scans fail as ``redis_error``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import redis

from digest_cleanup.errors import (
    PermanentError,
    SettingsError,
    StoreError,
    TargetsFileError,
    TransientError,
)
from digest_cleanup.kinds import CHANGED_SINCE_LISTING, KeyResult, Outcome, Page, TargetKind
from digest_cleanup.settings import Settings

#: How many keys one SCAN call asks for.  Redis takes it as a hint.
SCAN_COUNT = 1000
#: Keys per page, and so per pipelined round trip of ``OBJECT IDLETIME`` calls.
PAGE_SIZE = 1000

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# One atomic step per batch: read each key's idle time against the server's
# clock, and unlink it only if it is still idle since before the cutoff.
_DELETE_IF_IDLE = """
local now = redis.call('TIME')
local threshold = tonumber(now[1]) + tonumber(now[2]) / 1e6 - tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local idle = redis.call('OBJECT', 'IDLETIME', key)
  if not idle then
    out[i] = 'gone'
  elseif idle > threshold then
    redis.call('UNLINK', key)
    out[i] = 'deleted'
  else
    out[i] = 'touched'
  end
end
return out
"""


@dataclasses.dataclass(frozen=True)
class RedisKeysOptions:
    """The fields of a Redis keys target."""

    #: The keys to clean, as ``SCAN MATCH`` takes them; ``*`` and ``?`` are the wildcards.
    pattern: str
    #: The NAME of the environment variable holding the Redis URL (never the URL itself).
    url_env: str = "CLEANUP_REDIS_KEYS_URL"


class RedisKeysKind(TargetKind):
    """Keys matching a pattern, expired by how long they have been idle."""

    name = "redis-keys"
    Options = RedisKeysOptions
    max_batch_size = 1000
    options: RedisKeysOptions

    def __init__(self, target: str, options: RedisKeysOptions, settings: Settings) -> None:
        super().__init__(target, options, settings)
        url = settings.env.get(options.url_env)
        if not url:
            raise SettingsError(options.url_env, "is not set", "set it to redis://host:port/db")
        self._url = url
        self._match = re.compile(_glob_to_regex(options.pattern), re.DOTALL)
        self._client: redis.Redis | None = None

    @classmethod
    def parse_options(cls, target: str, raw: Mapping[str, Any]) -> RedisKeysOptions:
        """Check the fields as the targets file loads, naming the field at fault."""
        options: RedisKeysOptions = super().parse_options(target, raw)
        pattern = options.pattern
        if any(c in pattern for c in "[]\\"):
            # Redis and Python read [...] and \ differently, so scope checks could disagree.
            raise TargetsFileError(
                f"targets.{target}.pattern: use only * and ? as wildcards, not [ ] or \\"
            )
        if not pattern.strip("*?"):
            raise TargetsFileError(
                f"targets.{target}.pattern: {pattern!r} matches every key in the database; "
                "start it with a fixed prefix such as 'session:*'"
            )
        if not _ENV_NAME.match(options.url_env):
            raise TargetsFileError(
                f"targets.{target}.url_env: must be the NAME of an environment variable "
                "that holds the Redis URL, never the URL itself"
            )
        return options

    @classmethod
    def log_prefixes(cls, options: RedisKeysOptions) -> tuple[str, ...]:
        """The pattern up to its first wildcard (``session:``): the rest may name a customer."""
        head = re.split(r"[*?]", options.pattern, maxsplit=1)[0]
        return (head,) if head else ()

    def describe(self) -> str:
        """``redis://host:port/db match PATTERN``; never the password."""
        parts = urlsplit(self._url)
        location = f"{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        return f"redis://{location} match {self.options.pattern}"

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        """Page through the matching keys in sorted order, marking those idle since the cutoff."""
        with _mapped_errors():
            names = self._matching_keys()
        if start_after is not None:
            names = [n for n in names if n > start_after]
        for i in range(0, len(names), PAGE_SIZE):
            page = names[i : i + PAGE_SIZE]
            with _mapped_errors():
                pipe = self.client.pipeline(transaction=False)
                pipe.time()
                for key in page:
                    pipe.object("idletime", key)
                (seconds, micros), *idle = pipe.execute()
            threshold = seconds + micros / 1e6 - cutoff.timestamp()
            # A key deleted since SCAN has no idle time: scanned, but not expired.
            expired = [
                k for k, t in zip(page, idle, strict=True) if t is not None and t > threshold
            ]
            yield Page(scanned=len(page), expired=expired, cursor=page[-1])

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        """Unlink the keys still idle since the cutoff, in one atomic script call."""
        try:
            with _mapped_errors():
                script = self.client.register_script(_DELETE_IF_IDLE)  # sent by hash after once
                codes = script(keys=list(keys), args=[cutoff.timestamp()])
        except StoreError as exc:
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            return [KeyResult(i, outcome, exc.code, exc.message, exc.retry_after) for i in keys]
        results = []
        for key, code in zip(keys, codes, strict=True):
            if code == b"touched":
                results.append(
                    KeyResult(key, Outcome.SKIPPED, CHANGED_SINCE_LISTING, "used since the sweep")
                )
            else:
                # Unlinked now, or already gone: deleting is idempotent.
                results.append(KeyResult(key, Outcome.DELETED))
        return results

    def out_of_scope(self, key: str) -> str | None:
        """Refuse any key the pattern does not match (it reads after "a key is")."""
        if not self._match.fullmatch(key):
            return f"not matching the pattern {self.options.pattern!r}"
        return None

    def close(self) -> None:
        """Close the connection pool; the next call opens a new one."""
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> redis.Redis:
        """The connection pool, made on first use so that listing targets needs no server.

        One per process will do: redis-py opens fresh connections in a forked child.
        """
        if self._client is None:
            self._client = redis.Redis.from_url(
                self._url, socket_timeout=30, socket_connect_timeout=5
            )
        return self._client

    def _matching_keys(self) -> list[str]:
        names = set()  # SCAN may return a key more than once
        for raw in self.client.scan_iter(match=self.options.pattern, count=SCAN_COUNT):
            with contextlib.suppress(UnicodeDecodeError):
                names.add(raw.decode())
        return sorted(names)


@contextlib.contextmanager
def _mapped_errors() -> Iterator[None]:
    """Raise redis-py's errors as the pipeline's transient or permanent errors."""
    try:
        yield
    except redis.exceptions.RedisError as exc:
        raise classify(exc) from exc


def classify(exc: redis.exceptions.RedisError) -> StoreError:
    """Map one redis-py error to a retryable or a permanent error with a short code."""
    message = str(exc)[:200]
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthorizationError):
        return PermanentError("authentication_failed", message)
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return PermanentError("permission_denied", message)
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        # Also a server still loading its data set (BusyLoadingError).
        return TransientError("connection_error", message)
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return PermanentError("read_only", "the URL names a replica; point it at the primary")
    return PermanentError("redis_error", message)


def _glob_to_regex(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
