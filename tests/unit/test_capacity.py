"""Capacity planning: consumers = batches/s x service time / utilization, with warnings."""

from __future__ import annotations

import pytest

from digest_cleanup.cli import build_parser, main
from digest_cleanup.errors import UsageError
from digest_cleanup.ops.capacity import (
    NoMeasurements,
    ServiceTimes,
    parse_duration,
    plan,
)

#: 100 attempts of 500 items, each 0.5 s of which 0.45 s was the delete call.
STEADY = [(0.5, 0.45, 500)] * 100


def test_service_times_weigh_items_not_attempts():
    # Given 99 full batches of 1 s and one short final batch of 10 items in 0.1 s
    rows = [(1.0, 0.9, 500)] * 99 + [(0.1, 0.05, 10)]

    # When they are summarised
    service = ServiceTimes.from_timings(rows)

    # Then the per-item time is total seconds over total items, not a mean of ratios
    assert service.per_key == pytest.approx(99.1 / 49_510)
    assert service.attempts == 100
    assert service.median == 1.0
    assert service.p99 == 1.0
    assert service.overhead_median == pytest.approx(0.1)


def test_no_timings_is_a_clear_error():
    with pytest.raises(NoMeasurements, match="run a cleanup first"):
        ServiceTimes.from_timings([])


def test_consumers_follow_the_formula_and_round_up():
    # Given 0.5 s per 500-item batch, 120,000 artifacts in 10 minutes at 60% utilization
    service = ServiceTimes.from_timings(STEADY)

    # When planned
    result = plan(120_000, 600, service, batch_size=500, visibility_timeout=300)

    # Then 240 batches / 600 s = 0.4 batches/s; x 0.5 s / 0.6 = 0.333 -> 1 slot
    assert result.batches == 240
    assert result.batches_per_second == pytest.approx(0.4)
    assert result.batch_seconds == pytest.approx(0.5)
    assert result.consumers_exact == pytest.approx(0.4 * 0.5 / 0.6)
    assert (result.consumers, result.workers, result.concurrency) == (1, 1, 1)
    assert result.warnings == []


def test_a_short_window_needs_more_slots_spread_over_workers():
    # Given the same service times and a one-minute window
    service = ServiceTimes.from_timings(STEADY)

    # When planned with at most 8 slots per worker
    result = plan(120_000, 60, service, batch_size=500, visibility_timeout=300, per_worker=8)

    # Then 4 batches/s x 0.5 s / 0.6 = 3.33 -> 4 slots in one worker
    assert result.consumers == 4
    assert (result.workers, result.concurrency) == (1, 4)

    # And at 20 seconds it is 10 slots: two workers of five
    result = plan(120_000, 20, service, batch_size=500, visibility_timeout=300, per_worker=8)
    assert result.consumers == 10
    assert (result.workers, result.concurrency) == (2, 5)


def test_utilization_scales_the_consumers():
    service = ServiceTimes.from_timings(STEADY)
    half = plan(120_000, 60, service, batch_size=500, visibility_timeout=300, utilization=0.5)
    full = plan(120_000, 60, service, batch_size=500, visibility_timeout=300, utilization=1.0)
    assert half.consumers_exact == pytest.approx(2 * full.consumers_exact)


def test_a_window_past_the_s3_prefix_rate_warns():
    # Given 1.2M artifacts to delete in 5 minutes: 4,000 deletes/s
    service = ServiceTimes.from_timings(STEADY)

    result = plan(1_200_000, 300, service, batch_size=500, visibility_timeout=300)

    assert result.deletes_per_second == pytest.approx(4000)
    assert any("3,500" in w and "SlowDown" in w for w in result.warnings)


def test_slots_that_would_outrun_the_prefix_rate_at_full_speed_warn():
    # Given batches of 500 in 0.05 s: one slot alone reaches 10,000 deletes/s
    service = ServiceTimes.from_timings([(0.05, 0.04, 500)] * 10)

    result = plan(120_000, 600, service, batch_size=500, visibility_timeout=300)

    assert result.deletes_per_second == pytest.approx(200)
    assert result.peak_deletes_per_second == pytest.approx(10_000)
    assert any("full speed" in w for w in result.warnings)


def test_a_p99_close_to_the_visibility_timeout_warns():
    # Given one batch in a hundred takes 20 s and the visibility timeout is 60 s
    service = ServiceTimes.from_timings([(0.5, 0.45, 500)] * 98 + [(20.0, 19.9, 500)] * 2)

    result = plan(120_000, 3600, service, batch_size=500, visibility_timeout=60)

    assert service.p99 == 20.0
    assert any("visibility timeout" in w for w in result.warnings)
    # and with the default 300 s it is far enough
    assert not plan(120_000, 3600, service, batch_size=500, visibility_timeout=300).warnings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("1.5h", 5400)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "2 hours", "h", "-5m", "0s", "1h30"])
def test_bad_durations_are_refused_with_the_accepted_forms(text):
    with pytest.raises(UsageError, match="--window"):
        parse_duration(text)


def test_bad_plan_arguments_are_usage_errors():
    service = ServiceTimes.from_timings(STEADY)
    with pytest.raises(UsageError, match="--artifacts"):
        plan(0, 60, service, batch_size=500, visibility_timeout=300)
    with pytest.raises(UsageError, match="--utilization"):
        plan(10, 60, service, batch_size=500, visibility_timeout=300, utilization=1.5)


def test_the_plan_command_is_registered():
    args = build_parser().parse_args(["plan", "--artifacts", "120000", "--window", "2h"])
    assert args.command == "plan"
    assert args.utilization == pytest.approx(0.6)


def test_a_bad_window_exits_2_with_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CLEANUP_TARGETS_FILE", str(tmp_path / "absent.toml"))
    code = main(["plan", "--artifacts", "120000", "--window", "soon"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "--window: 'soon' is not a duration" in err


def test_a_delete_budget_sets_the_shortest_run_and_the_slots_that_saturate_it():
    # Given 1 ms per key (0.5 s per 500-key batch) and a budget of 3,300 keys/s
    service = ServiceTimes.from_timings(STEADY)

    # When 120,000 keys are planned for an hour
    result = plan(
        120_000, 3600, service, batch_size=500, visibility_timeout=300, delete_budget=3300
    )

    # Then no run is shorter than keys / budget, and 3,300 x 1 ms = 3.3 -> 4 slots saturate it
    assert result.budget_seconds == pytest.approx(120_000 / 3300)
    assert (result.saturating_consumers, result.saturating_workers) == (4, 1)
    assert result.warnings == []


def test_a_window_the_budget_cannot_meet_is_a_warning_that_names_the_setting():
    service = ServiceTimes.from_timings(STEADY)
    result = plan(120_000, 20, service, batch_size=500, visibility_timeout=300, delete_budget=3300)
    (warning,) = result.warnings
    assert "delete_rate" in warning
    assert "6,000 deletes/s" in warning
