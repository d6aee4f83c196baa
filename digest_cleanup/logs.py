"""Structured logs: one line per batch outcome and per run transition.

``CLEANUP_LOG_FORMAT=json`` turns every line into a JSON object.  Whatever
produced a line (our events, Celery, botocore), :func:`install` makes it safe
before it reaches a handler's stream:

* known secrets (AWS keys, the Redis password) are masked as ``***``;
* anything that looks like a key of a configured target (it starts with one of
  the leading parts the target's kind declares safe to log,
  :meth:`~digest_cleanup.kinds.TargetKind.log_prefixes`) has its customer part
  hashed, see :func:`redact`;
* loggers that dump whole S3 requests and responses at DEBUG are held at INFO.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from digest_cleanup.settings import Settings

#: Hex digits kept from the SHA-256 of a customer segment: enough to correlate
#: lines about one customer, too few to be a lookup key on their own.
HASH_DIGITS = 12
#: The hash key of a process without ``CLEANUP_LOG_HASH_KEY``: random, never written out.
_PROCESS_KEY = secrets.token_hex(32)
#: Loggers held at INFO even in a worker started with ``--loglevel=DEBUG``: their
#: DEBUG lines carry whole S3 requests and responses (every key of a batch, listing
#: pages, continuation tokens that are keys, signing headers).
QUIET_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")
#: Characters that end a key found inside free text: whitespace, quotes, the
#: delimiters of Python reprs, XML and URLs.
_ITEM_END = r"\s'\"<>,;&|(){}\[\]"


def redact(item: str, settings: Settings, keep: str = "") -> str:
    """Hash the customer segment: ``s/2026-11-22/cust-42.pdf`` -> ``s/2026-11-22/h:1f2e...``.

    The segment is ``CLEANUP_LOG_HASH_SEGMENT`` (0-based, ``/``-separated); unset,
    it is the last one, the file name, where digest keys carry the customer.  The
    hash is keyed (HMAC-SHA256 with ``CLEANUP_LOG_HASH_KEY``): a bare hash of a
    customer id is undone by hashing every possible id, a keyed one is not.

    ``keep`` is the leading part of ``item`` that is safe to log (the prefix the
    scrubber found it by): it is never hashed, so ``session:cust-42`` with
    ``keep="session:"`` becomes ``session:h:...``.
    """
    kept = len(keep) if keep and item.startswith(keep) else 0
    parts = item.split("/")
    index = len(parts) - 1 if settings.log_hash_segment is None else settings.log_hash_segment
    if index >= len(parts):
        return item
    start = sum(len(p) + 1 for p in parts[:index])
    # The part of the segment past the kept leading part, if the segment reaches past it.
    head = parts[index][: max(0, kept - start)]
    secret = parts[index][len(head) :]
    if secret and not secret.startswith("h:"):
        key = (settings.log_hash_key or _PROCESS_KEY).encode()
        digest = hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()
        parts[index] = f"{head}h:{digest[:HASH_DIGITS]}"
    return "/".join(parts)


class Scrubber:
    """Masks secrets and redacts keys in any text, such as a formatted log record."""

    def __init__(self, settings: Settings, prefixes: Iterable[str] = ()) -> None:
        self.settings = settings
        self.secrets = _variants(settings.secrets())
        alternatives: set[str] = set()
        for prefix in prefixes:
            if prefix:
                # URL-encoded too: request lines and query strings carry keys that way.
                alternatives.update({prefix, quote(prefix, safe="")})
        # Longest first, so one prefix that extends another wins the match.
        ordered = sorted(alternatives, key=len, reverse=True)
        self.items = (
            re.compile("(?P<head>" + "|".join(map(re.escape, ordered)) + f")[^{_ITEM_END}]*")
            if ordered
            else None
        )

    def __call__(self, text: str) -> str:
        if self.items is not None:
            text = self.items.sub(self._redact_match, text)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def _redact_match(self, match: re.Match[str]) -> str:
        token, head = match.group(0), match.group("head")
        if "/" not in token and "%2f" in token.lower():
            return quote(redact(unquote(token), self.settings, unquote(head)), safe="")
        return redact(token, self.settings, head)


def log_event(
    logger: logging.Logger,
    event: str,
    settings: Settings,
    *,
    level: int = logging.INFO,
    **fields: Any,
) -> None:
    """Emit one structured line: ``event key=value ...`` in text, an object in JSON."""
    text = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
    logger.log(level, "%s %s", event, text, extra={"dc_event": event, "dc_fields": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the structured fields at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "process": record.processName,
        }
        event = getattr(record, "dc_event", None)
        if event:
            data["event"] = event
            data.update(getattr(record, "dc_fields", {}))
        else:
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str)


class SafeFormatter(logging.Formatter):
    """Formats with an inner formatter, then scrubs the whole result (tracebacks too)."""

    def __init__(self, inner: logging.Formatter, scrub: Scrubber) -> None:
        super().__init__()
        self.inner = inner
        self.scrub = scrub

    def format(self, record: logging.LogRecord) -> str:
        return self.scrub(self.inner.format(record))


def install(logger: logging.Logger, settings: Settings, prefixes: Iterable[str] = ()) -> None:
    """Apply the configured format and scrubbing to ``logger``'s handlers.

    ``prefixes`` are the configured targets' key prefixes (see :func:`item_prefixes`).
    Safe to call again: a handler is never wrapped twice.
    """
    scrub = Scrubber(settings, prefixes)
    for handler in logger.handlers:
        current = handler.formatter
        inner = current.inner if isinstance(current, SafeFormatter) else current
        if settings.log_format == "json":
            inner = JsonFormatter()
        handler.setFormatter(SafeFormatter(inner or logging.Formatter(), scrub))
    for name in QUIET_LOGGERS:
        quiet = logging.getLogger(name)
        if quiet.getEffectiveLevel() < logging.INFO:
            quiet.setLevel(logging.INFO)


def item_prefixes(targets: Iterable[Any]) -> list[str]:
    """The leading parts of the targets' keys, as each target's kind declares them.

    ``targets`` are :class:`~digest_cleanup.targets.Target` objects; each
    kind says what its keys start with in :meth:`TargetKind.log_prefixes
    <digest_cleanup.kinds.TargetKind.log_prefixes>` (an S3 target's ``prefix``, a
    directory, ``session:``).  A target whose kind declares none cannot have its keys
    found in a line, so its keys would be logged as they are: that is said once, as a
    warning naming the target and the hook, each time the prefixes are gathered.
    """
    found: list[str] = []
    for target in targets:
        declared = [p for p in target.kind_class.log_prefixes(target.options) if p]
        if not declared:
            logging.getLogger("digest_cleanup.logs").warning(
                "target %s: its kind (%s) declares no key prefix that logs may show, so "
                "its keys cannot be told apart in a log line and are not redacted; give "
                "the kind a log_prefixes() or namespace() (docs/adding-a-cleanup-task.md)",
                target.name,
                target.kind_class.__name__,
            )
        found.extend(declared)
    return found


def _variants(secrets: Iterable[str]) -> list[str]:
    """Each secret as it may be written: raw, URL-quoted or unquoted, JSON-escaped."""
    found: set[str] = set()
    for secret in secrets:
        if secret:
            found.update(
                {secret, unquote(secret), quote(secret, safe=""), json.dumps(secret)[1:-1]}
            )
    # Longest first, so a secret that contains another is masked whole.
    return sorted((s for s in found if s), key=len, reverse=True)


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text
