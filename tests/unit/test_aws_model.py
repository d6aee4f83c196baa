"""The AWS model's pure parts: partitions, the per-partition write budget, and the latency draws."""

from __future__ import annotations

import random
import statistics

import pytest

from tests.rig.aws_budget import (
    DELETE_BASE,
    LATENCY_CLAMP,
    OTHER_BASE,
    WriteBudget,
    delete_latency_median,
    draw_latency,
    partition_of,
)
from tests.rig.aws_model import AwsModel


def test_a_partition_is_the_bucket_and_the_first_path_segment() -> None:
    assert partition_of("b", "statements/2026-11-22/cust-1.pdf") == ("b", "statements/")
    assert partition_of("b", "statements/") == ("b", "statements/")
    assert partition_of("b", "readme.txt") == ("b", "")
    assert partition_of("b", "/odd") == ("b", "/")


def test_a_budget_starts_full_and_takes_all_or_nothing() -> None:
    budget = WriteBudget(rate=100.0, capacity=50.0)
    statements, receipts = ("b", "statements/"), ("b", "receipts/")

    assert budget.take_all({statements: 30, receipts: 50}, now=0.0)
    # 20 left in statements: a request for 25 takes nothing, not even from receipts
    assert not budget.take_all({statements: 25, ("b", ""): 1}, now=0.0)
    assert budget.tokens(statements, 0.0) == 20.0
    assert budget.tokens(("b", ""), 0.0) == 50.0


def test_a_budget_refills_at_its_rate_up_to_its_capacity() -> None:
    budget = WriteBudget(rate=100.0, capacity=50.0)
    partition = ("b", "statements/")
    assert budget.take_all({partition: 50}, now=10.0)

    # Times a binary fraction apart, so that the sums are exact.
    assert budget.tokens(partition, 10.125) == 12.5
    assert not budget.take_all({partition: 13}, now=10.125)
    assert budget.take_all({partition: 12}, now=10.125)
    assert budget.tokens(partition, 10.125) == 0.5
    assert budget.tokens(partition, 100.0) == 50.0  # a long idle spell gives no more


def test_take_some_grants_whole_tokens_per_partition() -> None:
    budget = WriteBudget(rate=10.0, capacity=10.0)
    full, spent = ("b", "a/"), ("b", "z/")
    assert budget.take_all({spent: 10}, now=0.0)

    granted = budget.take_some({full: 4, spent: 3}, now=0.25)  # 2.5 tokens back in z/

    assert granted == {full: 4, spent: 2}
    assert budget.tokens(full, 0.25) == 6.0
    assert budget.tokens(spent, 0.25) == pytest.approx(0.5)


def test_the_model_refuses_unknown_forms_and_budgets_under_one_key() -> None:
    with pytest.raises(ValueError, match="forms"):
        AwsModel("http://127.0.0.1:1", forms=("429",))
    with pytest.raises(ValueError, match="capacity"):
        AwsModel("http://127.0.0.1:1", write_rate=1.0, burst_seconds=0.5)
    with pytest.raises(ValueError, match="form"):
        AwsModel("http://127.0.0.1:1").force_throttle(1, form="slow")


def test_delete_latency_grows_with_the_keys() -> None:
    assert delete_latency_median(0) == DELETE_BASE
    assert delete_latency_median(500) == pytest.approx(0.130)
    assert delete_latency_median(1000) == pytest.approx(0.230)


def test_latency_draws_centre_on_the_median_with_a_tail() -> None:
    rng = random.Random(3)
    draws = [draw_latency(OTHER_BASE, rng) for _ in range(4001)]

    assert statistics.median(draws) == pytest.approx(OTHER_BASE, rel=0.05)
    assert min(draws) > 0
    assert max(draws) <= OTHER_BASE * LATENCY_CLAMP
    # A spread, not a constant: a tenth of the draws are 1.4x the median or more.
    assert sum(d >= 1.4 * OTHER_BASE for d in draws) > 300
    again = random.Random(3)
    assert draws[:5] == [draw_latency(OTHER_BASE, again) for _ in range(5)]


def test_latency_draws_are_clamped() -> None:
    rng = random.Random(8)
    draws = [draw_latency(0.1, rng, sigma=2.0) for _ in range(1000)]

    assert max(draws) == pytest.approx(0.1 * LATENCY_CLAMP)
    assert sum(d == max(draws) for d in draws) > 100  # many would have been longer
