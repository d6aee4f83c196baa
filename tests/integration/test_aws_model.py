"""Tests for the model of S3's write budget, through boto3 and the model to a real weed mini."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from digest_cleanup.demo.seed import seed_keys
from tests.conftest import list_keys
from tests.rig.aws_budget import LIST_BASE, OTHER_BASE, delete_latency_median, draw_latency
from tests.rig.aws_model import AwsModel
from tests.rig.s3_messages import SLOWDOWN_MESSAGE
from tests.rig.servers import WeedServer, s3_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: A budget of 10 keys that takes 10 s to refill: no refill can hide a spent token.
SLOW_BUDGET: dict[str, Any] = {"write_rate": 1.0, "burst_seconds": 10.0, "latency": False}


@pytest.fixture
def make_model(weed: WeedServer) -> Iterator[Callable[..., AwsModel]]:
    """Start an :class:`AwsModel` in front of weed with the given options; stop it after."""
    models: list[AwsModel] = []

    def make(**options: Any) -> AwsModel:
        model = AwsModel(weed.endpoint_url, **options).start()
        models.append(model)
        return model

    yield make
    for model in models:
        model.stop()


class _PauseRecorder(AwsModel):
    """The model with its waits written down instead of slept, so tests need no clock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused: list[float] = []

    def pause(self, seconds: float) -> bool:
        self.paused.append(seconds)
        return False


def _client(model: AwsModel) -> S3Client:
    # One attempt per call, so that a SlowDown shows instead of being retried.
    return s3_client(model.endpoint_url, max_attempts=1)


def _keys(prefix: str, count: int, start: int = 0) -> list[str]:
    return [f"{prefix}cust-{i:05d}.pdf" for i in range(start, start + count)]


def _delete(client: S3Client, bucket: str, keys: list[str]) -> Any:
    return client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})


def _throttled(call: Callable[[], object]) -> dict[str, Any]:
    """Run ``call``, which must fail with SlowDown; return the error response."""
    with pytest.raises(ClientError) as caught:
        call()
    response: dict[str, Any] = dict(caught.value.response)
    assert response["Error"]["Code"] == "SlowDown"
    return response


# -------------------------------------------------------------- within budget


def test_a_delete_within_budget_is_forwarded_and_deletes(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    # Given 20 keys and the default 3,500-key budget
    keys = _keys("statements/2026-11-22/", 20)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(latency=False)

    # When one DeleteObjects names them all
    result = _delete(_client(model), bucket, keys)

    # Then weed deleted them, and the model recorded one accepted request from boto3
    assert {d["Key"] for d in result["Deleted"]} == set(keys)
    assert "Errors" not in result
    assert list_keys(s3, bucket) == set()
    [arrival] = model.arrivals()
    assert (arrival.keys, arrival.accepted, arrival.form) == (20, 20, None)
    assert "Boto3" in arrival.agent
    assert model.delete_requests == 1
    assert model.keys_accepted == 20
    assert model.throttled_requests == 0
    assert model.throttled_share() == 0.0


def test_each_partition_has_its_own_budget(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    # Given a 10-key budget per partition, and 10 keys in each of two prefixes
    keys = _keys("statements/", 10) + _keys("receipts/", 10)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(**SLOW_BUDGET, forms=("503",))
    client = _client(model)

    # When one request deletes all 20, twice the budget of one partition
    _delete(client, bucket, keys)

    # Then all went through, and each prefix's budget is spent while the bucket level's is not
    assert list_keys(s3, bucket) == set()
    _throttled(lambda: _delete(client, bucket, _keys("statements/", 1, start=50)))
    _delete(client, bucket, ["top-level.pdf"])
    assert [a.form for a in model.arrivals()] == [None, "503", None]


# -------------------------------------------------------------- over budget


def test_form_503_answers_slowdown_without_forwarding(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    keys = _keys("statements/", 15)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(**SLOW_BUDGET, forms=("503",))
    client = _client(model)

    response = _throttled(lambda: _delete(client, bucket, keys))

    assert response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "x-amz-retry-after" not in response["ResponseMetadata"]["HTTPHeaders"]
    assert list_keys(s3, bucket) == set(keys)
    assert model.throttles_by_form() == {"503": 1}
    # The throttled keys took no tokens: the whole budget of 10 is still there.
    _delete(client, bucket, keys[:10])
    assert list_keys(s3, bucket) == set(keys[10:])
    assert [(a.accepted, a.form) for a in model.arrivals()] == [(0, "503"), (10, None)]


def test_form_200_is_an_error_body_that_botocore_turns_into_a_500(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    keys = _keys("statements/", 15)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(**SLOW_BUDGET, forms=("200",))

    response = _throttled(lambda: _delete(_client(model), bucket, keys))

    # botocore finds the <Error> in the 200 and reports it as a 500 (its _handle_200_error).
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert response["Error"]["Message"] == SLOWDOWN_MESSAGE
    assert list_keys(s3, bucket) == set(keys)
    assert model.throttles_by_form() == {"200": 1}
    assert model.keys_accepted == 0


def test_form_per_key_deletes_the_keys_with_tokens_and_refuses_the_rest(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    # Given 15 keys in one prefix and a budget of 10
    keys = _keys("statements/", 15)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(**SLOW_BUDGET, forms=("per_key",))
    client = _client(model)

    # When one request names all 15
    result = _delete(client, bucket, keys)

    # Then the first 10 are deleted and the last 5 come back as SlowDown, still in weed
    assert {d["Key"] for d in result["Deleted"]} == set(keys[:10])
    assert {e["Key"] for e in result["Errors"]} == set(keys[10:])
    assert {(e["Code"], e["Message"]) for e in result["Errors"]} == {("SlowDown", SLOWDOWN_MESSAGE)}
    assert list_keys(s3, bucket) == set(keys[10:])
    assert [(a.keys, a.accepted, a.form) for a in model.arrivals()] == [(15, 10, "per_key")]

    # When the budget is empty, nothing is forwarded: every key is a SlowDown entry
    again = _delete(client, bucket, keys[10:])
    assert "Deleted" not in again
    assert {e["Key"] for e in again["Errors"]} == set(keys[10:])
    assert list_keys(s3, bucket) == set(keys[10:])
    assert model.keys_accepted == 10
    assert model.throttles_by_form() == {"per_key": 2}
    assert model.throttled_share() == 1.0


def test_a_single_delete_and_a_put_over_budget_get_503(
    make_model: Callable[..., AwsModel], bucket: str
) -> None:
    # Given a budget of one write per partition
    model = make_model(write_rate=0.1, burst_seconds=10.0, latency=False)
    client = _client(model)

    client.put_object(Bucket=bucket, Key="a/one.pdf", Body=b"x")
    put = _throttled(lambda: client.put_object(Bucket=bucket, Key="a/two.pdf", Body=b"x"))
    client.delete_object(Bucket=bucket, Key="b/one.pdf")
    delete = _throttled(lambda: client.delete_object(Bucket=bucket, Key="b/one.pdf"))

    assert put["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert delete["ResponseMetadata"]["HTTPStatusCode"] == 503
    # Only the deletes are recorded; reads are never limited.
    assert [(a.accepted, a.form) for a in model.arrivals()] == [(1, None), (0, "503")]
    assert client.get_object(Bucket=bucket, Key="a/one.pdf")["Body"].read() == b"x"
    client.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert model.list_requests == 1
    model.reset_counters()
    assert (model.delete_requests, model.list_requests) == (0, 0)


def test_forms_are_drawn_from_the_seed(make_model: Callable[..., AwsModel], bucket: str) -> None:
    def forms_seen(seed: int) -> list[str | None]:
        # A budget of one key: every 2-key request is over it.
        model = make_model(write_rate=0.1, burst_seconds=10.0, latency=False, seed=seed)
        client = _client(model)
        for i in range(12):
            with contextlib.suppress(ClientError):
                _delete(client, bucket, [f"s/{i}a", f"s/{i}b"])
        return [a.form for a in model.arrivals()]

    first = forms_seen(5)
    assert first == forms_seen(5)
    assert set(first) == {"503", "200", "per_key"}


# -------------------------------------------------------------- refill


def test_the_budget_refills_at_the_write_rate(
    make_model: Callable[..., AwsModel], bucket: str
) -> None:
    # Given a budget of 100 keys refilling at 200 keys a second, emptied by one request
    model = make_model(write_rate=200.0, burst_seconds=0.5, latency=False, forms=("503",))
    client = _client(model)
    _delete(client, bucket, _keys("statements/", 100))

    # When the next request comes right away, it is throttled: 100 tokens take 0.5 s
    _throttled(lambda: _delete(client, bucket, _keys("statements/", 100, start=100)))

    # Then 50 keys go through again once 50 tokens have come back, and not before
    deadline = time.monotonic() + 10
    while True:
        try:
            _delete(client, bucket, _keys("statements/", 50, start=200))
            break
        except ClientError:
            assert time.monotonic() < deadline, "the budget never refilled"
            time.sleep(0.02)
    arrivals = model.arrivals()
    emptied, accepted = arrivals[0], arrivals[-1]
    assert (emptied.accepted, accepted.accepted) == (100, 50)
    assert all(a.form == "503" for a in arrivals[1:-1])
    assert accepted.at - emptied.at >= 50 / 200 * 0.99
    assert model.max_window_keys(window=0.24) == 100  # the refill came no faster than 200/s


# -------------------------------------------------------------- forced throttles


def test_force_throttle_sends_x_amz_retry_after(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    keys = _keys("statements/", 3)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(latency=False)
    client = _client(model)

    model.force_throttle(1, retry_after_ms=1500)
    model.force_throttle(1, form="200", retry_after_ms=250)
    first = _throttled(lambda: _delete(client, bucket, keys))
    second = _throttled(lambda: _delete(client, bucket, keys))
    _delete(client, bucket, keys)

    assert first["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert first["ResponseMetadata"]["HTTPHeaders"]["x-amz-retry-after"] == "1500"
    assert second["ResponseMetadata"]["HTTPHeaders"]["x-amz-retry-after"] == "250"
    assert [a.form for a in model.arrivals()] == ["503", "200", None]
    assert list_keys(s3, bucket) == set()


def test_retry_after_ms_marks_every_throttled_answer(
    make_model: Callable[..., AwsModel], weed: WeedServer, s3: Any, bucket: str
) -> None:
    keys = _keys("statements/", 12)
    seed_keys(weed.endpoint_url, bucket, keys)
    model = make_model(**SLOW_BUDGET, forms=("per_key",), retry_after_ms=800)
    client = _client(model)

    result = _delete(client, bucket, keys)
    model.force_throttle(1, form="per_key")
    forced = _delete(client, bucket, keys[10:])

    assert result["ResponseMetadata"]["HTTPHeaders"]["x-amz-retry-after"] == "800"
    assert len(result["Errors"]) == 2
    # A forced per_key throttles every key, with the model's header.
    assert {e["Key"] for e in forced["Errors"]} == set(keys[10:])
    assert forced["ResponseMetadata"]["HTTPHeaders"]["x-amz-retry-after"] == "800"
    assert list_keys(s3, bucket) == set(keys[10:])


# -------------------------------------------------------------- records


def test_window_and_rate_queries_read_the_recorded_arrivals(
    make_model: Callable[..., AwsModel], bucket: str
) -> None:
    model = make_model(latency=False)
    client = _client(model)
    start = time.monotonic()

    for i in range(3):
        _delete(client, bucket, _keys(f"p{i}/", 40))
    end = time.monotonic() + 0.001

    assert model.max_window_keys(window=60.0) == 120
    assert model.max_window_keys(window=60.0, agent="Boto3") == 120
    assert model.max_window_keys(window=60.0, agent="no such client") == 0
    assert model.accepted_rate(start, end) == pytest.approx(120 / (end - start))
    assert model.accepted_rate(start, end, agent_contains="no such client") == 0.0


# -------------------------------------------------------------- latency


def test_each_request_waits_a_draw_for_its_kind(weed: WeedServer, bucket: str) -> None:
    # Given a model that writes its waits down, a seed, and a budget of 10 keys
    budget: dict[str, Any] = {"write_rate": 1.0, "burst_seconds": 10.0, "forms": ("503",)}
    with _PauseRecorder(weed.endpoint_url, seed=4, **budget) as model:
        client = _client(model)

        # When a delete within budget, a list page, a throttled delete and a HEAD arrive
        _delete(client, bucket, _keys("statements/", 8))
        client.list_objects_v2(Bucket=bucket)
        with contextlib.suppress(ClientError):
            _delete(client, bucket, _keys("statements/", 8, start=8))
        client.head_bucket(Bucket=bucket)

    # Then each waited the next draw of random.Random(seed + 1) around its own median
    drawn = random.Random(5)
    medians = [delete_latency_median(8), LIST_BASE, OTHER_BASE, OTHER_BASE]
    assert model.paused == [draw_latency(median, drawn) for median in medians]
    assert [a.form for a in model.arrivals()] == [None, "503"]


def test_no_latency_means_no_waits(weed: WeedServer, bucket: str) -> None:
    with _PauseRecorder(weed.endpoint_url, latency=False) as model:
        client = _client(model)
        _delete(client, bucket, _keys("statements/", 8))
        client.list_objects_v2(Bucket=bucket)

    assert model.paused == []
