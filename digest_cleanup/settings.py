"""Settings: the one place that reads the environment.

Everything else receives a :class:`Settings`.  A bad value fails at start-up with
a :class:`~digest_cleanup.errors.SettingsError` that names the variable and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from digest_cleanup.errors import SettingsError

#: Where the broker (and the run state) lives when ``CLEANUP_BROKER_URL`` is unset.
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
#: The targets file read when ``CLEANUP_TARGETS_FILE`` is unset.
DEFAULT_TARGETS_FILE = "targets.toml"
#: Seconds a delivered, unacknowledged message may stay with a worker before Redis
#: hands it to another.  It bounds how long a killed worker's batch waits, and it
#: must exceed the longest batch and the longest retry countdown (see ``retry_cap``).
DEFAULT_VISIBILITY_TIMEOUT = 300
#: How many times one batch is retried for transient failures before dead-lettering.
DEFAULT_MAX_RETRIES = 6
#: The first retry waits up to this many seconds; each later one doubles the ceiling.
DEFAULT_RETRY_BASE = 1.0
#: No retry waits longer than this (before the visibility-timeout clamp).
DEFAULT_RETRY_CAP = 60.0
#: Deliveries of one batch attempt before it is dead-lettered as ``worker_lost``.
DEFAULT_MAX_DELIVERIES = 3
#: The queue nothing consumes, where batches that still fail wait for an operator.
DEFAULT_DEAD_LETTER_QUEUE = "dead_letter"
#: Dead-letter entries past which an alert fires: a week of a bad outage at 120k keys
#: in 500-key batches is about 240 entries a run, so this is far past any normal week.
DEFAULT_DLQ_MAX_ENTRIES = 100_000
#: Days a dead-letter entry may wait before an alert fires: past a weekly run's cycle
#: several times over, and inside the run state's 35 days, after which a redrive of it
#: is refused as unknown_run.
DEFAULT_DLQ_RETENTION_DAYS = 28
#: Keys in the run store start with this, so one Redis can hold other data too.
DEFAULT_KEY_PREFIX = "dc"

#: Share of the visibility timeout a retry countdown may use at most.  Celery
#: holds an ETA message unacknowledged in the worker's memory; if the countdown
#: outlives the visibility timeout, Redis restores a copy and the batch runs twice.
RETRY_CAP_SHARE_OF_VISIBILITY = 0.5

LogFormat = Literal["text", "json"]
#: Celery pools a worker may run (``CLEANUP_WORKER_POOL``).
WORKER_POOLS = ("threads", "prefork", "solo", "gevent", "eventlet")
#: The pool a plain ``celery -A digest_cleanup worker`` runs: deletes wait on S3 and on
#: the shared delete budget, not on the CPU, so threads keep many in flight for little
#: memory, and leave the host's cores to the S3 client's own work.
DEFAULT_WORKER_POOL = "threads"
#: Threads of a worker in the threads pool started without ``--concurrency``.  Against AWS
#: S3 the shared delete budget, not the pool, sets the pace, and a handful of 500-key
#: deletes in flight reach it; against a local server 64 threads kept the server busy
#: (measured in BENCHMARKS.md).  A sweep slice takes one of them while it runs.
DEFAULT_WORKER_THREADS = 64


@dataclasses.dataclass(frozen=True)
class Settings:
    """Typed settings, normally built by :meth:`from_env`."""

    broker_url: str = DEFAULT_BROKER_URL
    targets_file: Path = Path(DEFAULT_TARGETS_FILE)
    s3_endpoint_url: str | None = None
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES
    retry_base: float = DEFAULT_RETRY_BASE
    retry_cap: float = DEFAULT_RETRY_CAP
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    dead_letter_queue: str = DEFAULT_DEAD_LETTER_QUEUE
    #: Dead-letter entries past which an alert fires (none is ever dropped).
    dlq_max_entries: int = DEFAULT_DLQ_MAX_ENTRIES
    #: Days a dead-letter entry may wait before an alert fires (none is ever dropped).
    dlq_retention_days: int = DEFAULT_DLQ_RETENTION_DAYS
    key_prefix: str = DEFAULT_KEY_PREFIX
    #: ``s3://bucket/prefix`` where run reports go; ``None`` keeps them in Redis only.
    audit_url: str | None = None
    log_format: LogFormat = "text"
    #: The Celery pool of a worker started without ``--pool`` (see ``DEFAULT_WORKER_POOL``).
    #: Celery lets a configured pool win over ``--pool=prefork``, so this is the setting
    #: that picks prefork.
    worker_pool: str = DEFAULT_WORKER_POOL
    #: Which ``/``-separated segment of a key holds a customer identifier (hashed in logs).
    log_hash_segment: int | None = None
    #: The key of that hash (HMAC-SHA256).  Unset, each process draws a random one, so a
    #: customer's lines correlate within one process only.
    log_hash_key: str | None = dataclasses.field(default=None, repr=False)
    aws_access_key_id: str | None = dataclasses.field(default=None, repr=False)
    aws_secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    aws_session_token: str | None = dataclasses.field(default=None, repr=False)
    aws_region: str | None = None
    aws_profile: str | None = None
    #: The console's admin, ``(user, password)`` from ``CLEANUP_CONSOLE_AUTH``; unset, the
    #: console refuses to start, since it never runs open.
    console_auth: tuple[str, str] | None = dataclasses.field(default=None, repr=False)
    #: The console's read-only users, from ``CLEANUP_CONSOLE_VIEWERS=user:pw,...``.
    console_viewers: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)
    #: Where the console is reached (``https://ops.example/cleanup``), so that a dead
    #: letter's Flower label can link to its page; unset, labels carry no link.
    console_url: str | None = None
    #: Environment values that target kinds may name (DSNs and other secrets).
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def effective_retry_cap(self) -> float:
        """The retry ceiling after the visibility-timeout clamp (see the module constant)."""
        return min(self.retry_cap, self.visibility_timeout * RETRY_CAP_SHARE_OF_VISIBILITY)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate every ``CLEANUP_*`` and ``AWS_*`` variable."""
        env = dict(os.environ if environ is None else environ)
        broker_url = env.get("CLEANUP_BROKER_URL", DEFAULT_BROKER_URL)
        _check_broker_url(broker_url)
        endpoint = env.get("CLEANUP_S3_ENDPOINT_URL") or None
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise SettingsError(
                "CLEANUP_S3_ENDPOINT_URL",
                f"{endpoint!r} is not an http(s) URL",
                "set it like http://127.0.0.1:8333, or unset it to use AWS S3",
            )
        log_format = env.get("CLEANUP_LOG_FORMAT", "text")
        if log_format not in ("text", "json"):
            raise SettingsError(
                "CLEANUP_LOG_FORMAT", f"{log_format!r} is unknown", "use text or json"
            )
        settings = cls(
            broker_url=broker_url,
            targets_file=Path(env.get("CLEANUP_TARGETS_FILE", DEFAULT_TARGETS_FILE)),
            s3_endpoint_url=endpoint,
            visibility_timeout=_int(
                env, "CLEANUP_VISIBILITY_TIMEOUT", DEFAULT_VISIBILITY_TIMEOUT, 2
            ),
            max_retries=_int(env, "CLEANUP_MAX_RETRIES", DEFAULT_MAX_RETRIES, 0),
            retry_base=_float(env, "CLEANUP_RETRY_BASE", DEFAULT_RETRY_BASE),
            retry_cap=_float(env, "CLEANUP_RETRY_CAP", DEFAULT_RETRY_CAP),
            max_deliveries=_int(env, "CLEANUP_MAX_DELIVERIES", DEFAULT_MAX_DELIVERIES, 1),
            dead_letter_queue=env.get("CLEANUP_DEAD_LETTER_QUEUE", DEFAULT_DEAD_LETTER_QUEUE),
            dlq_max_entries=_int(env, "CLEANUP_DLQ_MAX_ENTRIES", DEFAULT_DLQ_MAX_ENTRIES, 1),
            dlq_retention_days=_int(
                env, "CLEANUP_DLQ_RETENTION_DAYS", DEFAULT_DLQ_RETENTION_DAYS, 1
            ),
            key_prefix=env.get("CLEANUP_KEY_PREFIX", DEFAULT_KEY_PREFIX),
            audit_url=_audit_url(env),
            log_format=log_format,  # type: ignore[arg-type]  # checked just above
            worker_pool=_worker_pool(env),
            log_hash_segment=_optional_int(env, "CLEANUP_LOG_HASH_SEGMENT"),
            log_hash_key=_log_hash_key(env),
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
            aws_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            aws_profile=env.get("AWS_PROFILE") or None,
            **_console(env),
            env=env,
        )
        if settings.retry_base > settings.retry_cap:
            raise SettingsError(
                "CLEANUP_RETRY_BASE",
                f"{settings.retry_base} is larger than CLEANUP_RETRY_CAP={settings.retry_cap}",
                "make the base smaller than the cap",
            )
        return settings

    def secrets(self) -> list[str]:
        """Values that must never appear in logs, CLI output or dead-letter entries.

        Besides the AWS keys and the broker's password, these are the passwords of
        every connection string in the environment.  A target names the variable
        holding its DSN (``dsn_env``), so any variable may hold one; looking at the
        values keeps this module free of knowledge about targets.
        """
        found = [self.aws_secret_access_key, self.aws_session_token, self.aws_access_key_id]
        found.append(self.log_hash_key)
        found.append(urlsplit(self.broker_url).password)
        found.append(self.console_auth[1] if self.console_auth else None)
        found.extend(password for _, password in self.console_viewers)
        for value in self.env.values():
            found.extend(connection_passwords(value))
        # Longest first, so a secret that contains another is masked whole.
        return sorted({s for s in found if s}, key=len, reverse=True)


#: libpq's keyword form: ``password=secret`` or ``password='it\'s'``.
_CONNINFO_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']+)")


def connection_passwords(value: str) -> list[str]:
    """The passwords in a connection string.

    It reads a URL's user info and its ``password`` query parameter
    (``postgresql://user:pw@host/db``, ``redis://:pw@host``), and libpq's
    keyword form (``host=db password='p w'``).  A URL's password is returned both
    as written and percent-decoded, since either form may reach a log line.
    """
    found: list[str] = []
    if "://" in value:
        try:
            parts = urlsplit(value)
            query = parse_qs(parts.query)
        except ValueError:  # not a URL after all
            parts, query = None, {}
        if parts is not None and parts.password:
            found.extend(dict.fromkeys((parts.password, unquote(parts.password))))
        found.extend(query.get("password", []))
    for match in _CONNINFO_PASSWORD.finditer(value):
        raw = match.group(1)
        found.append(re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith("'") else raw)
    return [s for s in found if s]


def _check_broker_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise SettingsError(
            "CLEANUP_BROKER_URL",
            f"scheme {parts.scheme or '(none)'!r} is not supported",
            "use redis://[:password@]host:port/db or rediss:// for TLS",
        )
    try:
        parts.port  # noqa: B018 - urlsplit validates the port lazily
    except ValueError as exc:
        raise SettingsError(
            "CLEANUP_BROKER_URL", f"bad port ({exc})", "fix the port number"
        ) from exc
    if not parts.hostname:
        raise SettingsError("CLEANUP_BROKER_URL", "has no host", "use redis://host:port/db")


#: The shortest ``CLEANUP_LOG_HASH_KEY`` accepted: 128 bits of hex.
MIN_LOG_HASH_KEY_LENGTH = 32


def _log_hash_key(env: Mapping[str, str]) -> str | None:
    key = env.get("CLEANUP_LOG_HASH_KEY") or None
    if key is not None and len(key) < MIN_LOG_HASH_KEY_LENGTH:
        raise SettingsError(
            "CLEANUP_LOG_HASH_KEY",
            f"is {len(key)} characters; a short key lets anyone who can read the logs "
            "recover customer ids by trying them all",
            f"use at least {MIN_LOG_HASH_KEY_LENGTH}, e.g. the output of "
            "'python3 -c \"import secrets; print(secrets.token_hex(32))\"'",
        )
    return key


def _audit_url(env: Mapping[str, str]) -> str | None:
    audit_url = env.get("CLEANUP_AUDIT_URL") or None
    if audit_url is not None and not audit_url.startswith("s3://"):
        raise SettingsError(
            "CLEANUP_AUDIT_URL",
            f"{audit_url!r} is not an s3:// URL",
            "set it like s3://audit-bucket/reports/, or unset it",
        )
    return audit_url


def _console(env: Mapping[str, str]) -> dict[str, Any]:
    """The console's admin, read-only viewers and URL (``CLEANUP_CONSOLE_*``)."""
    raw = env.get("CLEANUP_CONSOLE_AUTH") or None
    admin = None if raw is None else _user_password("CLEANUP_CONSOLE_AUTH", raw)
    name = "CLEANUP_CONSOLE_VIEWERS"
    parts = [p.strip() for p in (env.get(name) or "").split(",") if p.strip()]
    viewers = tuple(_user_password(name, part) for part in parts)
    users = [user for user, _ in viewers] + ([admin[0]] if admin else [])
    if len(set(users)) < len(users):
        raise SettingsError(name, "names a user twice", "give every console user its own name")
    url = (env.get("CLEANUP_CONSOLE_URL") or "").rstrip("/") or None
    if url is not None and urlsplit(url).scheme not in ("http", "https"):
        raise SettingsError(
            "CLEANUP_CONSOLE_URL",
            f"{url!r} is not an http(s) URL",
            "set it like http://127.0.0.1:8642, or unset it",
        )
    return {"console_auth": admin, "console_viewers": viewers, "console_url": url}


def _user_password(name: str, raw: str) -> tuple[str, str]:
    """``user:password``, both non-empty (the password may hold colons, the user not)."""
    user, colon, password = raw.partition(":")
    if not (colon and user.strip() and password):
        raise SettingsError(
            name,
            "is not user:password with both parts set",
            f"set it like {name}=ops:a-long-random-password",
        )
    return user.strip(), password


def _worker_pool(env: Mapping[str, str]) -> str:
    pool = env.get("CLEANUP_WORKER_POOL") or DEFAULT_WORKER_POOL
    if pool not in WORKER_POOLS:
        raise SettingsError(
            "CLEANUP_WORKER_POOL",
            f"{pool!r} is not a Celery pool",
            f"use one of {', '.join(WORKER_POOLS)}, or unset it for {DEFAULT_WORKER_POOL}",
        )
    return pool


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(
            name, f"{raw!r} is not a whole number", f"set a number >= {minimum}"
        ) from None
    if value < minimum:
        raise SettingsError(
            name, f"{value} is below the minimum {minimum}", f"set a number >= {minimum}"
        )
    return value


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    if not env.get(name):
        return None
    return _int(env, name, 0, 0)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(name, f"{raw!r} is not a number", "set a number of seconds") from None
    if value <= 0:
        raise SettingsError(name, f"{value} is not positive", "set a number of seconds above 0")
    return value
