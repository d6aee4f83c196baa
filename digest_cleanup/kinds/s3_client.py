"""The S3 client: one per process, made for the pipeline's retries, and its errors mapped.

:func:`make_client` builds the client every S3 target of a process shares;
:func:`mapped_errors` turns botocore's exceptions into the pipeline's
:class:`~digest_cleanup.errors.TransientError` and
:class:`~digest_cleanup.errors.PermanentError`, which retry policy keys off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

import boto3
import botocore.handlers
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from digest_cleanup import __version__
from digest_cleanup.errors import PermanentError, TransientError
from digest_cleanup.kinds import s3_listing
from digest_cleanup.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Connections the one client of a process keeps for reuse.  A worker in the threads
#: pool runs one delete per thread at once, and a pool smaller than that opens and
#: drops a connection for every batch past it; connections open on demand, so a
#: prefork child holds one.
CONNECTIONS_PER_CLIENT = 64
#: Per-key and per-request error codes worth retrying.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "OperationAborted",
        "500",
        "502",
        "503",
        "504",
    }
)
#: :func:`mapped_errors` as the check and the probe take it.
ErrorMapper = Callable[[], AbstractContextManager[None]]


def make_client(
    settings: Settings, *, max_attempts: int = 1, lean_listing: bool = True
) -> S3Client:
    """An S3 client for these settings.

    Retries are the pipeline's job (task-level backoff that frees the worker and
    honours ``Retry-After``), so deletes go out with a single attempt.  Its
    ListObjectsV2 pages carry ``Key``, ``LastModified`` and ``ETag`` only (see
    :mod:`digest_cleanup.kinds.s3_listing`).  With ``lean_listing=False`` botocore
    parses every response as it ships, timestamps included: ``verify`` lists with
    such a client, so a fault in the sweep's reader cannot hide itself.
    """
    core = botocore.session.get_session()
    if lean_listing:
        core.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=fast_timestamp
        )
    session = boto3.Session(
        botocore_session=core,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
        aws_session_token=settings.aws_session_token,
        region_name=settings.aws_region or "us-east-1",
        profile_name=settings.aws_profile,
    )
    config = Config(
        # total_max_attempts counts the first attempt; botocore's max_attempts key counts
        # retries only, so max_attempts=1 meant a hidden retry of every throttled delete.
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=5,
        read_timeout=60,
        max_pool_connections=CONNECTIONS_PER_CLIENT,
        # Server access logs and test proxies tell the workers of a fleet apart by this.
        user_agent_extra=f"digest-cleanup/{__version__} pid/{os.getpid()}",
        s3={"addressing_style": "path"} if settings.s3_endpoint_url else None,
    )
    # boto3-stubs-lite has no per-service overloads, so say which client this is.
    client = cast(
        "S3Client", session.client("s3", endpoint_url=settings.s3_endpoint_url, config=config)
    )
    if lean_listing:
        # Listing is the guard pass's cost, and it comes before the first delete.
        s3_listing.install(
            client, fast_timestamp, getattr(botocore.handlers, "_handle_200_error", None)
        )
    return client


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Map botocore's errors to the pipeline's transient/permanent classes."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        code = str(error.get("Code") or meta.get("HTTPStatusCode") or "Unknown")
        message = str(error.get("Message") or "")
        retry_after = _retry_after(meta.get("HTTPHeaders", {}))
        status = int(meta.get("HTTPStatusCode") or 0)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            raise TransientError(code, message, retry_after=retry_after) from exc
        raise PermanentError(code, message) from exc
    except (ConnectTimeoutError, ReadTimeoutError) as exc:
        raise TransientError("timeout", str(exc)) from exc
    except (EndpointConnectionError, ConnectionClosedError) as exc:
        raise TransientError("connection_error", str(exc)) from exc
    except BotoCoreError as exc:
        raise TransientError("client_error", str(exc)) from exc


def _retry_after(headers: dict[str, str]) -> float | None:
    """Seconds the server asked for: ``x-amz-retry-after`` (milliseconds, what newer AWS
    SDKs read) or ``Retry-After`` (seconds).  S3 itself sends neither today."""
    for name, scale in (("x-amz-retry-after", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            continue
    return None


def fast_timestamp(value: str) -> datetime:
    """botocore's default parser goes through dateutil, a hot spot in big listings."""
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        from botocore.utils import parse_timestamp

        parsed: datetime = parse_timestamp(value)
        return parsed


def aware(value: datetime) -> datetime:
    """A timestamp botocore gave, in UTC when it carried no zone."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
