"""Audit objects are written once against a real S3 server: never overwritten, even on retry."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from digest_cleanup.audit import reports
from digest_cleanup.settings import Settings
from tests.conftest import list_keys
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.servers import WeedServer

SUMMARY = {"status": "complete", "deleted": 3, "ended_at": "2026-10-25T03:00:05.123Z",
           "token": "0123456789abcdef0123456789abcdef"}  # fmt: skip


class NoConditionalPuts(ReverseProxy):
    """A server that does not implement ``If-None-Match`` on PutObject: it answers 501."""

    def __init__(self, upstream_url: str) -> None:
        super().__init__(upstream_url)
        self.lock = threading.Lock()
        self.seen: list[str] = []

    def handle(self, request: ProxyHandler) -> None:
        body = request.read_body()
        with self.lock:
            self.seen.append(request.command)
        if request.command == "PUT" and request.headers.get("If-None-Match"):
            request.reply(
                501,
                b"<Error><Code>NotImplemented</Code><Message>A header you provided implies "
                b"functionality that is not implemented</Message></Error>",
                [("Content-Type", "application/xml")],
            )
            return
        request.relay(body)


@pytest.fixture
def unconditional(weed: WeedServer) -> Iterator[NoConditionalPuts]:
    with NoConditionalPuts(weed.endpoint_url) as proxy:
        yield proxy


def _settings(endpoint: str, bucket: str) -> Settings:
    return Settings(
        s3_endpoint_url=endpoint,
        audit_url=f"s3://{bucket}/reports/",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


def _read(s3: Any, bucket: str, url: str, name: str) -> bytes:
    key = url.removeprefix(f"s3://{bucket}/") + name
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_a_report_goes_to_its_own_incarnations_folder(weed, s3, bucket):
    url = reports.write_report(_settings(weed.endpoint_url, bucket), "t", "run-1", SUMMARY, [])

    assert url == f"s3://{bucket}/reports/t/run-1/20261025T030005123Z-0123456789ab/"
    assert list_keys(s3, bucket) == {
        "reports/t/run-1/20261025T030005123Z-0123456789ab/summary.json",
        "reports/t/run-1/20261025T030005123Z-0123456789ab/not_deleted.jsonl",
    }


@pytest.mark.parametrize("server", ["conditional", "no-conditional-puts"])
def test_writing_the_same_report_again_keeps_the_first(weed, s3, bucket, unconditional, server):
    # Given a report written once, on a server that takes If-None-Match or one that does not
    endpoint = weed.endpoint_url if server == "conditional" else unconditional.endpoint_url
    settings = _settings(endpoint, bucket)
    first = reports.write_report(settings, "t", "run-1", SUMMARY, [{"key": "a", "code": "X"}])
    assert first is not None

    # When the same run end's report is written again, with other content
    again = reports.write_report(settings, "t", "run-1", {**SUMMARY, "deleted": 99}, [])

    # Then it names the same place, and what was there first is still there, unchanged
    assert again == first
    assert json.loads(_read(s3, bucket, first, "summary.json"))["deleted"] == 3
    assert json.loads(_read(s3, bucket, first, "not_deleted.jsonl")) == {"key": "a", "code": "X"}
    if server == "no-conditional-puts":
        # (by looking first, where the server cannot refuse the overwrite itself)
        assert "HEAD" in unconditional.seen


def test_two_purge_records_in_one_second_are_two_objects(weed, s3, bucket):
    settings = _settings(weed.endpoint_url, bucket)
    at = "2026-10-25T03:00:05Z"

    first = reports.write_purge(settings, at, [{"entry": "dl-1"}])
    second = reports.write_purge(settings, at, [{"entry": "dl-2"}])

    assert first != second
    assert len(list_keys(s3, bucket, "reports/purges/")) == 2
