"""Real Redis and S3 servers for the tests: the demo's, with what only the tests need.

The servers themselves are the demo's (:mod:`digest_cleanup.demo.servers`).  The suite
adds a Redis that can require a password, an ACL user or TLS and can crash and restart
empty (:mod:`.redis`), and fixtures' ``required_*`` helpers that skip a test without the
server, or fail it under CI (:mod:`.weed` for ``weed mini``).  Every name the tests use
is importable from here.
"""

from __future__ import annotations

from digest_cleanup.demo.servers import (
    LOOPBACK,
    WEED_PORT_FLAGS,
    BinaryNotFoundError,
    ServerError,
    ServerStartError,
    WeedServer,
    find_redis_server,
    find_weed,
    free_port,
    free_ports,
    s3_client,
)
from tests.rig.servers.redis import RedisServer, TlsFiles, redis_ping, required_redis
from tests.rig.servers.weed import required_weed
from tests.rig.tools import require, require_tool

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
