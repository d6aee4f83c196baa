"""Structured logs: one line per batch outcome and per run transition.

``CLEANUP_LOG_FORMAT=json`` turns every line into a JSON object.  Item keys are
only ever logged through :func:`redact`, which hashes the configured customer
segment (``CLEANUP_LOG_HASH_SEGMENT``), and known secrets are masked in any line.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from digest_cleanup.settings import Settings

#: Hex digits kept from the SHA-256 of a customer segment: enough to correlate
#: lines about one customer, too few to be a lookup key on their own.
HASH_DIGITS = 12


def redact(item: str, settings: Settings) -> str:
    """Hash the customer segment: ``s/2026-11-22/cust-42.pdf`` -> ``s/2026-11-22/h:1f2e...``."""
    index = settings.log_hash_segment
    if index is None:
        return item
    parts = item.split("/")
    if index < len(parts) and parts[index]:
        digest = hashlib.sha256(parts[index].encode()).hexdigest()[:HASH_DIGITS]
        parts[index] = f"h:{digest}"
    return "/".join(parts)


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

    def __init__(self, secrets: list[str] | None = None) -> None:
        super().__init__()
        self.secrets = [s for s in (secrets or []) if s]

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, "dc_event", None)
        if event:
            data["event"] = event
            data.update(getattr(record, "dc_fields", {}))
        else:
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return mask(json.dumps(data, default=str), self.secrets)


class SecretMaskingFilter(logging.Filter):
    """Masks known secrets in any text line, whatever produced it."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            masked = mask(message, self.secrets)
            if masked != message:
                record.msg, record.args = masked, None
        return True


def mask(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def install(logger: logging.Logger, settings: Settings) -> None:
    """Apply the configured format and secret masking to ``logger``'s handlers."""
    secrets = settings.secrets()
    for handler in logger.handlers:
        if settings.log_format == "json":
            handler.setFormatter(JsonFormatter(secrets))
        handler.addFilter(SecretMaskingFilter(secrets))


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text
