"""The Redis keys kind from the guide, through the real sweep, batch and dead-letter path.

``run_cleanup`` comes from the shipped plugin: it runs a targets file through the
project's own Celery tasks in an in-process worker, and returns the finished run
and its dead letters.  The pipeline uses database 0 of the plugin's throwaway
Redis (``cleanup_redis_server``), and the keys being cleaned live in another.
Nothing here needs more than the plugin.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

import pytest
import redis

from digest_cleanup.clock import utcnow
from digest_cleanup.errors import TargetsFileError
from digest_cleanup.kinds import Outcome
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing.pipeline import PipelineResult
from digest_cleanup.testing.redis_server import RedisServer

pytest_plugins = ["digest_cleanup.testing.plugin"]

#: The database of the plugin's Redis that holds the keys (the pipeline's is 0).
STORE_DB = 7
URL_ENV = "GUIDE_REDIS_URL"
TARGETS = f"""
[targets.sessions]
kind = "tests.guide.redis_keys_kind:RedisKeysKind"
pattern = "session:*"
url_env = "{URL_ENV}"
retention_days = 0
schedule = "0 4 * * *"
batch_size = 100
"""
DAY = 86_400

RunCleanup = Callable[..., PipelineResult]


@pytest.fixture
def store_url(cleanup_redis_server: RedisServer) -> str:
    """An empty database of the plugin's Redis for the keys the target cleans."""
    url = cleanup_redis_server.url_for(STORE_DB)
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(store_url) as client:
        yield client


def seed(store: redis.Redis, keys: Iterable[str], idle_days: int) -> None:
    """Create ``keys`` as if nobody had touched them for ``idle_days``."""
    store.set("seed-template", b"session data")
    payload = store.dump("seed-template")
    store.delete("seed-template")
    pipe = store.pipeline(transaction=False)
    for key in keys:
        # RESTORE ... IDLETIME sets the idle time, so nothing has to wait for a clock.
        pipe.restore(key, 0, payload, replace=True, idletime=idle_days * DAY)
    pipe.execute()


def keys(store: redis.Redis) -> set[str]:
    return {k.decode() for k in store.scan_iter(count=1000)}


def test_idle_keys_matching_the_pattern_are_deleted_and_the_rest_kept(
    run_cleanup: RunCleanup, store: redis.Redis, store_url: str
) -> None:
    # Given 250 idle sessions, 30 active ones, and idle keys outside the pattern
    idle = [f"session:{i:04d}" for i in range(250)]
    active = [f"session:active-{i:02d}" for i in range(30)]
    others = [f"cache:{i:02d}" for i in range(20)]
    seed(store, idle, idle_days=40)
    seed(store, active, idle_days=0)
    seed(store, others, idle_days=40)

    # When the target runs through the pipeline, for a cutoff a day ago: the active
    # sessions were used after it however long the run takes to start
    cutoff = utcnow() - timedelta(days=1)
    result = run_cleanup(TARGETS, env={URL_ENV: store_url}, cutoff=cutoff)

    # Then exactly the idle sessions are gone, in batches of 100
    run = result.run
    assert run["status"] == "complete"
    assert (run["listed"], run["expired"], run["batches"]) == (280, 250, 3)
    assert (run["deleted"], run["skipped"], run["dead_lettered"]) == (250, 0, 0)
    assert result.dead_letters == []
    assert keys(store) == set(active) | set(others)


def test_a_key_used_after_the_sweep_is_skipped_and_a_gone_key_counts_as_deleted(
    store: redis.Redis, store_url: str
) -> None:
    # Given a kind that has listed three idle sessions
    seed(store, ["session:a", "session:b", "session:c"], idle_days=40)
    target = parse_targets(TARGETS).get("sessions")
    kind = target.make_kind(Settings(env={URL_ENV: store_url}))
    cutoff = target.cutoff_for(utcnow())
    (page,) = kind.scan(cutoff)
    assert page.expired == ["session:a", "session:b", "session:c"]

    # When one is read and another deleted by someone else before the batch runs
    store.get("session:a")
    store.delete("session:b")
    results = kind.delete(page.expired, cutoff)

    # Then the read one is kept, and the other two are reported deleted
    assert [(r.key, r.outcome) for r in results] == [
        ("session:a", Outcome.SKIPPED),
        ("session:b", Outcome.DELETED),
        ("session:c", Outcome.DELETED),
    ]
    assert keys(store) == {"session:a"}
    assert kind.out_of_scope("cache:1") == "not matching the pattern 'session:*'"
    assert kind.out_of_scope("session:1") is None
    # and logs show of a key no more than its fixed part, "session:"
    assert kind.log_prefixes(target.options) == ("session:",)
    kind.close()


def test_a_user_who_may_not_run_scripts_gets_permission_denied_dead_letters(
    run_cleanup: RunCleanup, store: redis.Redis, store_url: str
) -> None:
    # Given a Redis user that may scan and read, but not run the delete script
    user, password = f"guide-{secrets.token_hex(4)}", secrets.token_hex(8)
    store.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        commands=["+@all", "-eval", "-evalsha"],
    )
    seed(store, [f"session:{i:02d}" for i in range(10)], idle_days=40)
    url = store_url.replace("redis://", f"redis://{user}:{password}@")
    try:
        # When the target runs as that user
        result = run_cleanup(TARGETS, env={URL_ENV: url})
    finally:
        store.acl_deluser(user)

    # Then every key is dead-lettered as permission_denied, and still there
    assert result.run["status"] == "complete_with_failures"
    assert (result.run["expired"], result.run["dead_lettered"]) == (10, 10)
    assert set(result.dead_letter_codes.values()) == {"permission_denied"}
    assert len(result.dead_letter_codes) == 10
    assert {e["reason"] for e in result.dead_letters} == {"permanent_error"}
    assert len(keys(store)) == 10


@pytest.mark.parametrize(
    ("pattern", "complaint"),
    [("*", "matches every key"), ("session:[ab]*", "only * and ?")],
)
def test_a_pattern_that_could_reach_other_keys_is_refused(pattern: str, complaint: str) -> None:
    with pytest.raises(TargetsFileError) as refused:
        parse_targets(TARGETS.replace('"session:*"', f'"{pattern}"'))
    assert str(refused.value).startswith("targets.sessions.pattern: ")
    assert complaint in str(refused.value)
