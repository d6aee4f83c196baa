"""Log lines: structured events, JSON lines, hashed customer segments and masked secrets."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
from collections.abc import Iterator

import pytest

from digest_cleanup.errors import SettingsError
from digest_cleanup.logs import Scrubber, install, item_prefixes, log_event, redact
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets

KEY = "statements/2026-11-22/cust-004217.pdf"
HASH_KEY = "k" * 32
CUSTOMER_HASH = (
    "h:" + hmac.new(HASH_KEY.encode(), b"cust-004217.pdf", hashlib.sha256).hexdigest()[:12]
)
#: Secrets with characters that JSON and URLs escape, so every written form is checked.
AWS_SECRET = 'wJalr"XUtn\\FEMI/K7MDENG+bPxRfiCY'
REDIS_PASSWORD = "s3cr3t@redis:pw"  # written percent-encoded in the broker URL


def settings(**kw: object) -> Settings:
    base: dict[str, object] = {
        "broker_url": "redis://:s3cr3t%40redis%3Apw@127.0.0.1:6379/0",
        "aws_access_key_id": "AKIAOPSLOGTEST0001",
        "aws_secret_access_key": AWS_SECRET,
        "log_hash_segment": 2,
        "log_hash_key": HASH_KEY,
    }
    return Settings(**(base | kw))  # type: ignore[arg-type]


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of our own with one handler writing to a buffer, as Celery sets up the root."""
    logger = logging.getLogger("digest_cleanup.tests.logs")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def test_redact_hashes_the_configured_segment_only():
    assert redact(KEY, settings()) == f"statements/2026-11-22/{CUSTOMER_HASH}"
    # The same customer always gets the same hash, so lines about it can be correlated.
    assert redact(KEY, settings()) == redact(KEY, settings())
    assert redact("statements/2026-11-22/cust-000001.pdf", settings()) != redact(KEY, settings())
    assert redact(redact(KEY, settings()), settings()) == redact(KEY, settings())
    first = redact(KEY, settings(log_hash_segment=1))
    assert first.startswith("statements/h:")
    assert first.endswith("/cust-004217.pdf")


def test_the_hash_is_keyed_so_trying_every_customer_id_does_not_undo_it():
    bare = "h:" + hashlib.sha256(b"cust-004217.pdf").hexdigest()[:12]
    other_key = settings(log_hash_key="o" * 32)

    assert bare not in redact(KEY, settings())
    assert redact(KEY, other_key) != redact(KEY, settings())
    # without a key each process draws its own: still keyed, never the bare hash
    assert bare not in redact(KEY, settings(log_hash_key=None))
    assert redact(KEY, settings(log_hash_key=None)) == redact(KEY, settings(log_hash_key=None))


def test_a_short_log_hash_key_is_refused_naming_the_setting():
    with pytest.raises(SettingsError, match="CLEANUP_LOG_HASH_KEY"):
        Settings.from_env({"CLEANUP_LOG_HASH_KEY": "short"})
    assert "k" * 32 in Settings.from_env({"CLEANUP_LOG_HASH_KEY": "k" * 32}).secrets()


def test_redact_hashes_the_last_segment_when_none_is_configured():
    assert redact(KEY, settings(log_hash_segment=None)) == f"statements/2026-11-22/{CUSTOMER_HASH}"


def test_items_are_redacted_wherever_they_appear_in_a_line():
    scrub = Scrubber(settings(), ["statements/"])
    cursor = "start-after=statements%2F2026-11-22%2Fcust-004217.pdf"
    lines = {
        # an exception message quoting a key
        f"Reject: could not delete {KEY!r}": f"Reject: could not delete "
        f"'statements/2026-11-22/{CUSTOMER_HASH}'",
        # a DeleteObjects body
        f"<Object><Key>{KEY}</Key></Object>": f"<Object><Key>statements/2026-11-22/"
        f"{CUSTOMER_HASH}</Key></Object>",
        # a URL-encoded listing cursor in a request line
        f"GET /b?prefix=statements%2F&{cursor} HTTP/1.1":
        "GET /b?prefix=statements%2F&start-after=statements%2F2026-11-22%2F"
        f"{CUSTOMER_HASH.replace(':', '%3A')} HTTP/1.1",
    }  # fmt: skip
    for line, expected in lines.items():
        assert scrub(line) == expected
        assert "cust-004217" not in scrub(line)
    # Text that only names the prefix, or other paths, is left alone.
    assert scrub("location s3://bucket/statements/") == "location s3://bucket/statements/"
    assert scrub("receipts/2026-11-22/cust-1.json") == "receipts/2026-11-22/cust-1.json"


def test_secrets_are_masked_in_every_form_they_are_written_in():
    scrub = Scrubber(settings())
    for text in (
        AWS_SECRET,
        json.dumps(AWS_SECRET),
        "Credential=AKIAOPSLOGTEST0001/20261122/us-east-1/s3/aws4_request",
        "redis://:s3cr3t%40redis%3Apw@127.0.0.1:6379/0",
        f"AUTH {REDIS_PASSWORD}",
    ):
        masked = scrub(text)
        assert "***" in masked
        for secret in ("wJalr", "AKIAOPSLOGTEST0001", "s3cr3t"):
            assert secret not in masked, (text, masked)


def test_item_prefixes_come_from_targets_that_have_one():
    targets = parse_targets(
        """
        [targets.statements]
        bucket = "digests"
        prefix = "statements/"
        retention_days = 30
        schedule = "0 3 * * 0"
        [targets.snapshots]
        kind = "digest_cleanup.testing.memory:MemoryKind"
        store = "logs"
        prefix = ""
        retention_days = 30
        schedule = "0 3 * * 0"
        """
    )
    assert item_prefixes(targets) == ["statements/"]


def test_a_target_whose_keys_logs_cannot_find_is_named_in_a_warning(caplog):
    # Given a target whose kind declares no prefix a log line could find its keys by
    targets = parse_targets(
        """
        [targets.snapshots]
        kind = "digest_cleanup.testing.memory:MemoryKind"
        store = "logs"
        prefix = ""
        retention_days = 30
        schedule = "0 3 * * 0"
        """
    )

    # When the worker gathers the prefixes its log scrubber looks for
    with caplog.at_level(logging.WARNING, logger="digest_cleanup.logs"):
        assert item_prefixes(targets) == []

    # Then the warning names the target and the hooks that would fix it
    (record,) = [r for r in caplog.records if r.name == "digest_cleanup.logs"]
    assert "target snapshots" in record.getMessage()
    assert "log_prefixes()" in record.getMessage()


def test_json_format_gives_one_object_per_line_with_the_event_fields(captured):
    logger, stream = captured
    install(logger, settings(log_format="json"), ["statements/"])

    fields = {"run_id": "r1", "batch_id": "r1-b00001", "deleted": 499, "duration": 0.25}
    log_event(logger, "batch", settings(), **fields)
    logger.info("Task %s received", "digest_cleanup.delete_batch[r1-b00001]")

    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    event, plain = (json.loads(line) for line in lines)
    assert event["event"] == "batch"
    assert {k: event[k] for k in fields} == fields
    assert event["level"] == "info"
    assert plain["message"] == "Task digest_cleanup.delete_batch[r1-b00001] received"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_tracebacks_are_scrubbed_too(captured, log_format):
    logger, stream = captured
    install(logger, settings(log_format=log_format), ["statements/"])

    try:
        raise RuntimeError(f"delete of {KEY} failed with secret {AWS_SECRET}")
    except RuntimeError:
        logger.exception("batch blew up")

    out = stream.getvalue()
    assert "RuntimeError" in out
    assert "cust-004217" not in out
    assert "wJalr" not in out
    assert CUSTOMER_HASH in out


def test_installing_twice_wraps_a_handler_once(captured):
    logger, stream = captured
    install(logger, settings(), ["statements/"])
    install(logger, settings(), ["statements/"])

    logger.info("deleting %s", KEY)

    assert stream.getvalue() == f"[INFO] deleting statements/2026-11-22/{CUSTOMER_HASH}\n"


def test_s3_request_dumps_stay_out_even_at_debug(captured):
    # Given botocore logging at DEBUG, as under `celery worker --loglevel=DEBUG`
    logger, stream = captured
    botocore = logging.getLogger("botocore")
    handler = logging.StreamHandler(stream)
    botocore.addHandler(handler)
    botocore.setLevel(logging.DEBUG)
    try:
        install(logger, settings(), ["statements/"])

        # When botocore dumps a request body and logs a warning
        endpoint = logging.getLogger("botocore.endpoint")
        endpoint.debug("Sending http request: <Delete><Object><Key>%s</Key></Object>", KEY)
        endpoint.warning("Retry needed, retrying request after delay of: 0.4")

        # Then only the warning is written
        assert stream.getvalue() == "Retry needed, retrying request after delay of: 0.4\n"
    finally:
        botocore.removeHandler(handler)
        botocore.setLevel(logging.NOTSET)
