"""The conditional-delete probe against a real S3 server, with servers that ignore conditions.

The probe is what ``digest-cleanup check`` and a run's start rely on, so each way a
server can get conditions wrong is played here by a small rule set in front of
``weed mini``: one that ignores DeleteObject's ``If-Match`` only, one that ignores
multipart ETags only, and one that answers every HEAD with 403, as AWS does for a
missing key when the role's ``s3:ListBucket`` is limited to prefixes.
"""

from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from digest_cleanup.kinds import Finding
from digest_cleanup.kinds.s3 import S3Kind, S3Options
from digest_cleanup.kinds.s3_probe import NOT_HONOURED, PROBE_PREFIX
from digest_cleanup.settings import Settings
from tests.rig.faults import FaultProxy
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.s3_messages import (
    ACCESS_DENIED_BODY,
    error_body,
    fix_integrity_headers,
)

#: A multipart ETag condition in a DeleteObjects body, quoted either way.
_MULTIPART_ETAG = re.compile(rb"<ETag>(&quot;|\")?[0-9a-fA-F]+-[0-9]+(&quot;|\")?</ETag>")


class Misbehaving(ReverseProxy):
    """An S3 server that gets one part of conditional deletes wrong, on request.

    ``head_forbidden`` answers 403 to a HEAD of any key, present or not, so a
    probe that passes never relied on HEAD's answer.
    """

    label = "misbehaving s3"

    def __init__(
        self,
        upstream_url: str,
        *,
        ignore_if_match: bool = False,
        ignore_multipart: bool = False,
        head_forbidden: bool = False,
        refuse_multipart: bool = False,
    ) -> None:
        super().__init__(upstream_url)
        self.ignore_if_match = ignore_if_match
        self.ignore_multipart = ignore_multipart
        self.head_forbidden = head_forbidden
        self.refuse_multipart = refuse_multipart
        self._lock = threading.Lock()
        #: (method, path) of every request, in order.
        self.seen: list[tuple[str, str]] = []

    def handle(self, request: ProxyHandler) -> None:
        body = request.read_body()
        path = unquote(urlsplit(request.path).path)
        with self._lock:
            self.seen.append((request.command, path))
        on_a_key = bool(path.lstrip("/").partition("/")[2])
        if request.command == "HEAD" and on_a_key and self.head_forbidden:
            request.reply(403, ACCESS_DENIED_BODY, [])
            return
        if self.refuse_multipart and "uploads" in parse_qs(urlsplit(request.path).query,
                                                           keep_blank_values=True):  # fmt: skip
            request.reply(501, error_body("NotImplemented", "multipart uploads"), [])
            return
        if request.command == "DELETE":
            condition = request.headers.get("If-Match", "")
            if self.ignore_if_match or (self.ignore_multipart and "-" in condition):
                request.relay(body, drop=frozenset({"if-match"}))
                return
        if request.command == "POST" and body and self.ignore_multipart:
            stripped = _MULTIPART_ETAG.sub(b"", body)
            if stripped != body:
                headers = fix_integrity_headers(request.forward_headers(stripped), stripped)
                response = request.exchange(headers, stripped)
                if response is not None:
                    request.send(*response)
                return
        request.relay(body)


def _kind(endpoint: str, bucket: str, **options: Any) -> S3Kind:
    settings = Settings(s3_endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s")
    return S3Kind("statements", S3Options(bucket=bucket, prefix="statements/", **options), settings)


def _by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def _everything(s3: Any, bucket: str) -> list[tuple[str, str]]:
    """Every version and delete marker left in the bucket."""
    listing = s3.list_object_versions(Bucket=bucket)
    return [
        (v["Key"], v.get("VersionId", ""))
        for v in (*listing.get("Versions", []), *listing.get("DeleteMarkers", []))
    ]


@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
def test_an_honest_store_passes_on_both_paths_and_multipart_and_keeps_nothing(
    weed, s3, bucket, versioned
):
    # Given an honest store, versioned or not, seen through a recording proxy
    if versioned:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    with Misbehaving(weed.endpoint_url) as recorder:
        kind = _kind(recorder.endpoint_url, bucket)

        # When the target is checked
        findings = _by_check(kind.check())

    # Then conditional deletes pass on both paths, multipart ETags too, with no leftovers
    assert findings["conditional deletes"].status == "ok", findings
    assert "DeleteObjects and DeleteObject" in findings["conditional deletes"].detail
    assert findings["multipart ETags"].status == "ok", findings
    assert "probe cleanup" not in findings
    assert _everything(s3, bucket) == []
    # and every object the probe wrote was inside the target's prefix
    writes = [path for method, path in recorder.seen if method == "PUT"]
    assert writes
    assert all(p.startswith(f"/{bucket}/statements/{PROBE_PREFIX}") for p in writes), writes


def test_a_store_that_ignores_only_deleteobjects_if_match_is_caught(weed, s3, bucket):
    # Given a store that honours DeleteObjects' <ETag> but ignores DeleteObject's If-Match
    with Misbehaving(weed.endpoint_url, ignore_if_match=True) as server:
        kind = _kind(server.endpoint_url, bucket)

        # When the run-start probe runs
        findings = _by_check(kind.probe_conditions())

    # Then it is a problem a run refuses on, naming the single-key path
    verdict = findings["conditional deletes"]
    assert (verdict.status, verdict.code) == ("problem", NOT_HONOURED), verdict
    assert "NOT honoured by DeleteObject:" in verdict.detail
    assert "conditional_deletes = false" in verdict.detail
    assert _everything(s3, bucket) == []


def test_a_store_that_ignores_multipart_etags_is_caught(weed, s3, bucket):
    # Given a store that honours plain ETags but ignores multipart ones ("hex-N")
    with Misbehaving(weed.endpoint_url, ignore_multipart=True) as server:
        kind = _kind(server.endpoint_url, bucket)

        # When the run-start probe runs
        findings = _by_check(kind.probe_conditions())

    # Then plain objects pass and multipart ETags are a problem on both paths
    assert findings["conditional deletes"].status == "ok", findings
    multipart = findings["multipart ETags"]
    assert (multipart.status, multipart.code) == ("problem", NOT_HONOURED), multipart
    assert "DeleteObjects (multipart ETag), DeleteObject (multipart ETag)" in multipart.detail
    assert _everything(s3, bucket) == []


def test_the_probe_needs_no_404_for_a_missing_key(weed, s3, bucket):
    # Given a store that answers 403 to every HEAD, as AWS does for a missing key when
    # the role's s3:ListBucket is limited to prefixes (deploy/iam-policy.json)
    with Misbehaving(weed.endpoint_url, head_forbidden=True) as server:
        kind = _kind(server.endpoint_url, bucket)

        # When the target is checked
        findings = _by_check(kind.check())

    # Then the probe still proves conditions, since it looks by listing
    assert findings["conditional deletes"].status == "ok", findings
    assert findings["multipart ETags"].status == "ok", findings
    assert _everything(s3, bucket) == []


def test_an_opted_out_target_is_warned_by_check_and_not_probed_at_run_start(weed, s3, bucket):
    # Given a store that ignores every condition, and a target that sends none
    with FaultProxy(weed.endpoint_url) as proxy:
        proxy.strip_conditions = True
        kind = _kind(proxy.endpoint_url, bucket, conditional_deletes=False)

        # When it is checked, and when a run would start
        checked = _by_check(kind.check())
        at_start = kind.probe_conditions()

    # Then check warns (its deletes are unconditional anyway), and a run has nothing to prove
    assert checked["conditional deletes"].status == "warning", checked
    assert "NOT honoured" in checked["conditional deletes"].detail
    assert at_start == []
    assert _everything(s3, bucket) == []


def test_a_store_without_multipart_uploads_is_probed_on_plain_objects_only(weed, s3, bucket):
    # Given a store that refuses to create multipart uploads
    with Misbehaving(weed.endpoint_url, refuse_multipart=True) as server:
        kind = _kind(server.endpoint_url, bucket)

        # When the run-start probe runs
        findings = _by_check(kind.probe_conditions())

    # Then plain objects prove conditions, and the multipart part is a warning, not a refusal
    assert findings["conditional deletes"].status == "ok", findings
    assert findings["multipart ETags"].status == "warning", findings
    assert "not probed" in findings["multipart ETags"].detail
    assert not [f for f in findings.values() if f.status == "problem"]
    assert _everything(s3, bucket) == []
