"""The shipped ``run_pipeline`` helper never reaches an S3 it was not pointed at."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from digest_cleanup.testing.pipeline import run_pipeline
from tests.conftest import list_keys, s3_targets, seed_split
from tests.rig.proxy import ProxyHandler, ReverseProxy
from tests.rig.servers import WeedServer

#: What a developer's shell might hold: none of it may reach the requests a test sends.
AMBIENT = {
    "AWS_ACCESS_KEY_ID": "AKIAAMBIENTDEVELOPER",
    "AWS_SECRET_ACCESS_KEY": "ambient-secret",
    "AWS_SESSION_TOKEN": "ambient-session-token",
    "AWS_PROFILE": "ambient-production",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
}


class Recorder(ReverseProxy):
    """Forwards every request as it came, keeping the headers that say who signed it."""

    def __init__(self, upstream_url: str) -> None:
        super().__init__(upstream_url)
        self.lock = threading.Lock()
        self.signatures: list[str] = []

    def handle(self, request: ProxyHandler) -> None:
        with self.lock:
            self.signatures.append(
                f"{request.headers.get('Authorization', '')} "
                f"{request.headers.get('X-Amz-Security-Token', '')}"
            )
        request.relay(request.read_body())


@pytest.fixture
def recorder(weed: WeedServer) -> Iterator[Recorder]:
    with Recorder(weed.endpoint_url) as proxy:
        yield proxy


def test_without_an_endpoint_it_refuses_to_run_and_names_the_parameter(redis_url, bucket):
    # Given an S3 target and no endpoint: the run would go to AWS itself
    # When the helper is asked to run it
    # Then it refuses before anything starts, naming the parameter that fixes it
    with pytest.raises(ValueError, match="s3_endpoint_url="):
        run_pipeline(s3_targets(bucket), redis_url=redis_url, timeout=10)


def test_ambient_aws_credentials_and_profiles_never_sign_its_requests(
    redis_url: str, s3: Any, bucket: str, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a shell holding a developer's AWS credentials, a profile and an endpoint
    for name, value in AMBIENT.items():
        monkeypatch.setenv(name, value)
    cutoff = seed_split(s3, bucket, ["statements/old.pdf"], ["statements/new.pdf"])

    # When a test runs a target through the helper against its own endpoint
    result = run_pipeline(
        s3_targets(bucket), redis_url=redis_url, cutoff=cutoff,
        s3_endpoint_url=recorder.endpoint_url,
    )  # fmt: skip

    # Then the run went to that endpoint, signed with none of the shell's credentials
    assert result.run["status"] == "complete"
    assert result.run["deleted"] == 1
    assert list_keys(s3, bucket) == {"statements/new.pdf"}
    assert recorder.signatures
    for signature in recorder.signatures:
        assert "AKIAAMBIENTDEVELOPER" not in signature
        assert "ambient-session-token" not in signature
    # and the caller's environment is as it was
    assert {name: os.environ.get(name) for name in AMBIENT} == AMBIENT
