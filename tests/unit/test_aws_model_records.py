"""The AWS model's record queries: the busiest window and the accepted rate, on given arrivals."""

from __future__ import annotations

import pytest

from tests.rig.aws_records import Arrival, accepted_rate, max_window_keys


def _at(at: float, accepted: int, agent: str = "Boto3/1.40 pipeline") -> Arrival:
    return Arrival(at=at, keys=max(accepted, 1), accepted=accepted, form=None, agent=agent)


def test_max_window_keys_slides_to_the_busiest_window_wherever_it_starts() -> None:
    # Given arrivals out of order, the busiest second running from 10.5 to 11.5
    arrivals = [_at(11.4, 300), _at(10.0, 200), _at(10.5, 400), _at(11.6, 100), _at(13.0, 650)]

    # Then the window found is that one: neither a whole-second bucket ([10, 11) holds 600)
    # nor one that starts at the first arrival
    assert max_window_keys(arrivals, 1.0) == 700
    assert max_window_keys(arrivals, 3.1) == 1650
    assert max_window_keys(arrivals, 0.5) == 650
    assert max_window_keys([], 1.0) == 0


def test_a_window_is_half_open() -> None:
    # Two arrivals exactly one window apart never share a window.
    arrivals = [_at(1.0, 10), _at(2.0, 20)]

    assert max_window_keys(arrivals, 1.0) == 20
    assert max_window_keys(arrivals, 1.0001) == 30


def test_only_accepted_keys_count() -> None:
    throttled = Arrival(at=5.0, keys=500, accepted=0, form="503", agent="a")
    per_key = Arrival(at=5.1, keys=500, accepted=120, form="per_key", agent="a")

    assert max_window_keys([throttled, per_key, _at(5.2, 500)], 1.0) == 620
    assert accepted_rate([throttled, per_key, _at(5.2, 500)], 5.0, 7.0) == 310.0


def test_accepted_rate_counts_arrivals_in_a_half_open_span() -> None:
    arrivals = [_at(0.5, 100), _at(1.0, 200), _at(1.5, 300), _at(2.0, 400)]

    assert accepted_rate(arrivals, 1.0, 2.0) == 500.0
    assert accepted_rate(arrivals, 0.0, 4.0) == 250.0
    assert accepted_rate(arrivals, 3.0, 3.5) == 0.0


def test_queries_refuse_empty_spans() -> None:
    with pytest.raises(ValueError, match="window"):
        max_window_keys([], 0.0)
    with pytest.raises(ValueError, match="after start"):
        accepted_rate([], 2.0, 2.0)
