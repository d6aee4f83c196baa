"""Settings and the targets file: good values load, bad ones name the setting and the fix."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from digest_cleanup.errors import SettingsError, TargetsFileError
from digest_cleanup.settings import Settings
from digest_cleanup.targets import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_DELETE,
    load_targets,
    parse_targets,
)

GOOD = """
[targets.statements]
bucket = "digest-artifacts"
prefix = "statements/"
retention_days = 30
schedule = "0 3 * * 0"
batch_size = 500
"""


def test_settings_defaults_and_values():
    settings = Settings.from_env({})
    assert settings.broker_url == "redis://127.0.0.1:6379/0"
    assert settings.s3_endpoint_url is None

    settings = Settings.from_env(
        {
            "CLEANUP_BROKER_URL": "rediss://user:pw@redis.internal:6380/2",
            "CLEANUP_S3_ENDPOINT_URL": "http://127.0.0.1:8333",
            "CLEANUP_VISIBILITY_TIMEOUT": "120",
            "CLEANUP_TARGETS_FILE": "/etc/x.toml",
            "AWS_DEFAULT_REGION": "eu-west-1",
        }
    )
    assert settings.visibility_timeout == 120
    assert settings.aws_region == "eu-west-1"
    assert settings.targets_file == Path("/etc/x.toml")
    assert "pw" in settings.secrets()


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"CLEANUP_BROKER_URL": "amqp://localhost"}, "CLEANUP_BROKER_URL"),
        ({"CLEANUP_BROKER_URL": "redis://:6379/0"}, "CLEANUP_BROKER_URL"),
        ({"CLEANUP_VISIBILITY_TIMEOUT": "soon"}, "CLEANUP_VISIBILITY_TIMEOUT"),
        ({"CLEANUP_VISIBILITY_TIMEOUT": "1"}, "CLEANUP_VISIBILITY_TIMEOUT"),
        ({"CLEANUP_S3_ENDPOINT_URL": "localhost:8333"}, "CLEANUP_S3_ENDPOINT_URL"),
        ({"CLEANUP_AUDIT_URL": "/var/reports"}, "CLEANUP_AUDIT_URL"),
        ({"CLEANUP_LOG_FORMAT": "xml"}, "CLEANUP_LOG_FORMAT"),
        ({"CLEANUP_RETRY_BASE": "100", "CLEANUP_RETRY_CAP": "10"}, "CLEANUP_RETRY_BASE"),
        ({"CLEANUP_WORKER_POOL": "fork"}, "CLEANUP_WORKER_POOL"),
    ],
)
def test_bad_setting_names_itself(env, name):
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(name + ":")
    assert err.value.name == name


def test_retry_cap_is_clamped_below_the_visibility_timeout():
    # A countdown longer than the visibility timeout would make Redis run the batch twice.
    settings = Settings.from_env({"CLEANUP_VISIBILITY_TIMEOUT": "20", "CLEANUP_RETRY_CAP": "600"})
    assert settings.effective_retry_cap == 10


def test_targets_file_loads_with_defaults(tmp_path):
    path = tmp_path / "targets.toml"
    path.write_text(GOOD.replace("batch_size = 500\n", ""))
    targets = load_targets(path)
    target = targets.get("statements")
    assert target.kind == "s3"
    assert target.batch_size == DEFAULT_BATCH_SIZE
    assert target.max_delete == DEFAULT_MAX_DELETE
    assert target.options.prefix == "statements/"
    assert len(target.config_digest) == 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('prefix = "statements/"', 'prefix = ""'), "allow_whole_bucket = true"),
        (("retention_days = 30", "retention_days = -1"), "retention_days: -1 is negative"),
        (('schedule = "0 3 * * 0"', 'schedule = "0 3 * *"'), "5-field crontab"),
        (('schedule = "0 3 * * 0"', 'schedule = "0 25 * * 0"'), "schedule"),
        (("batch_size = 500", "batch_size = 1001"), "outside 1..1000"),
        (("batch_size = 500", "batch_size = 500\ncolour = 1"), "unknown field 'colour'"),
        (("retention_days = 30", 'retention_days = "30"'), "retention_days: expected int"),
        (('bucket = "digest-artifacts"', ""), "missing required field 'bucket'"),
        (("batch_size = 500", 'batch_size = 500\nversions = "some"'), "versions"),
        (("batch_size = 500", 'batch_size = 500\nkind = "ftp"'), "unknown kind 'ftp'"),
        (("batch_size = 500", "batch_size = 500\nmax_delete = 0"), "max_delete"),
        (("batch_size = 500", "batch_size = 500\ndelete_rate = -1"), "delete_rate"),
        (("batch_size = 500", 'batch_size = 500\ndelete_rate = "fast"'), "keys per second"),
    ],
)
def test_bad_target_is_refused_with_the_field_named(change, message):
    old, new = change
    with pytest.raises(TargetsFileError) as err:
        parse_targets(GOOD.replace(old, new))
    assert "targets.statements" in str(err.value)
    assert message in str(err.value)


def test_whole_bucket_must_be_asked_for_by_name():
    text = GOOD.replace('prefix = "statements/"', 'prefix = ""\nallow_whole_bucket = true')
    assert parse_targets(text).get("statements").options.prefix == ""


def test_missing_targets_file_names_the_setting(tmp_path):
    with pytest.raises(TargetsFileError, match="CLEANUP_TARGETS_FILE"):
        load_targets(tmp_path / "nope.toml")


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(TargetsFileError, match="defines: statements"):
        parse_targets(GOOD).get("receipts")


def test_last_slot_is_the_latest_crontab_instant():
    target = parse_targets(GOOD).get("statements")  # Sundays 03:00 UTC
    assert target.last_slot(datetime(2026, 11, 29, 9, 41, tzinfo=UTC)) == datetime(
        2026, 11, 29, 3, 0, tzinfo=UTC
    )
    assert target.last_slot(datetime(2026, 11, 29, 2, 59, tzinfo=UTC)) == datetime(
        2026, 11, 22, 3, 0, tzinfo=UTC
    )
    assert target.last_slot(datetime(2026, 11, 29, 3, 0, 30, tzinfo=UTC)) == datetime(
        2026, 11, 29, 3, 0, tzinfo=UTC
    )
    assert target.cutoff_for(datetime(2026, 11, 29, 3, 0, tzinfo=UTC)) == datetime(
        2026, 10, 30, 3, 0, tzinfo=UTC
    )


@pytest.mark.parametrize(
    ("endpoint", "written", "budget"),
    [
        (None, "", 3300.0),  # AWS S3: a little under its 3,500 writes/s per prefix
        ("https://s3.eu-west-1.amazonaws.com", "", 3300.0),
        ("http://127.0.0.1:8333", "", 0.0),  # another server: AWS's figure says nothing
        ("http://127.0.0.1:8333", "delete_rate = 1200\n", 1200.0),
        (None, "delete_rate = 0\n", 0.0),  # turned off on AWS too
    ],
)
def test_the_delete_budget_defaults_by_endpoint_and_the_target_can_set_it(
    endpoint, written, budget
):
    target = parse_targets(GOOD + written).get("statements")
    assert target.delete_budget(Settings(s3_endpoint_url=endpoint)) == budget


def test_workers_default_to_the_threads_pool_and_prefork_can_be_asked_for():
    assert Settings.from_env({}).worker_pool == "threads"
    assert Settings.from_env({"CLEANUP_WORKER_POOL": "prefork"}).worker_pool == "prefork"


def test_a_plain_worker_is_the_fast_layout_and_an_asked_for_pool_holds():
    from digest_cleanup.app import create_app

    plain = create_app(Settings.from_env({})).conf
    assert (plain.worker_pool, plain.worker_concurrency) == ("threads", 64)
    prefork = create_app(Settings.from_env({"CLEANUP_WORKER_POOL": "prefork"})).conf
    assert (prefork.worker_pool, prefork.worker_concurrency) == ("prefork", None)
