"""Reaching the broker: a start-up check, TLS options and a URL safe to print.

The broker is also the run store, so a worker or beat that cannot reach it can
do nothing useful.  Celery's own answer is to retry the connection for ever,
logging an error every few seconds; a process supervisor restarting a process
that exits with one clear line is the better signal.  Connections lost *after*
start-up are still Celery's to re-establish (a Redis restart is survived).
"""

from __future__ import annotations

import ssl
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from digest_cleanup.settings import Settings

#: Attempts to reach the broker when a worker or beat starts, before it gives up.
STARTUP_ATTEMPTS = 3
#: Seconds between those attempts: enough for a Redis that is starting up next to it.
STARTUP_RETRY_SECONDS = 1.0
#: Seconds one connection attempt may take: an unroutable host must not hang the start.
CONNECT_TIMEOUT = 3.0
#: The only ``maxmemory-policy`` under which Redis never drops a queued batch or run state.
SAFE_EVICTION_POLICY = "noeviction"


def safe_url(url: str) -> str:
    """The URL with its password replaced by ``***``, fit for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def ssl_options(url: str) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for a ``rediss://`` URL that names no ``ssl_*`` option.

    kombu falls back to ``ssl_cert_reqs=CERT_NONE`` (any certificate accepted)
    for such a URL, while redis-py, which serves the run store, verifies.  Both
    must verify: an unverified TLS connection to the broker can be intercepted.
    A URL that names its options (``?ssl_cert_reqs=required&ssl_ca_certs=...``)
    is read by kombu itself and left alone.
    """
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    if any(name.startswith("ssl_") for name in parse_qs(parts.query)):
        return None
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_check_hostname": True}


def unreachable(settings: Settings, attempts: int = STARTUP_ATTEMPTS) -> str | None:
    """Why the broker cannot be used, in one line, or ``None`` when it answers PING."""
    client = redis.Redis.from_url(
        settings.broker_url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT
    )
    try:
        for attempt in range(1, attempts + 1):
            try:
                client.ping()
                return eviction_problem(client, settings.broker_url)
            except redis.AuthenticationError as exc:
                # Retrying cannot fix a wrong password or ACL user.
                return _problem(settings, f"authentication failed ({exc})")
            except redis.RedisError as exc:
                if attempt == attempts:
                    return _problem(settings, str(exc))
                time.sleep(STARTUP_RETRY_SECONDS)
    finally:
        client.close()
    raise AssertionError("unreachable: the last attempt returns")


def eviction_policy(client: redis.Redis) -> str | None:
    """Redis's ``maxmemory-policy``, or None where CONFIG is not allowed (managed Redis)."""
    try:
        raw = client.config_get("maxmemory-policy")
    except redis.ResponseError:
        return None
    return str(raw.get("maxmemory-policy", "")) or None


def eviction_problem(client: redis.Redis, url: str) -> str | None:
    """Why this Redis may not serve as broker and run store, or None.

    An evicting Redis drops queued batches and run state under memory pressure,
    silently: runs would end with keys never deleted and nothing to say so.  A
    Redis that hides its configuration cannot be checked here; ``digest-cleanup
    check`` warns about it.
    """
    policy = eviction_policy(client)
    if policy is None or policy == SAFE_EVICTION_POLICY:
        return None
    return (
        f"the Redis at CLEANUP_BROKER_URL={safe_url(url)} has maxmemory-policy {policy}, so "
        "it may evict queued batches and run state under memory pressure; set "
        f"maxmemory-policy {SAFE_EVICTION_POLICY} (redis.conf, or CONFIG SET "
        f"maxmemory-policy {SAFE_EVICTION_POLICY})"
    )


def _problem(settings: Settings, reason: str) -> str:
    message = (
        f"cannot reach the broker at CLEANUP_BROKER_URL={safe_url(settings.broker_url)}: "
        f"{reason}; start Redis or fix CLEANUP_BROKER_URL"
    )
    for secret in settings.secrets():
        message = message.replace(secret, "***")
    return message
