"""The benchmark's plan: fresh copies, paired rounds, and an order that favours neither side."""

from __future__ import annotations

from benchmarks.pipeline import Layout
from benchmarks.run import _plan

LAYOUTS = [Layout.parse("default"), Layout.parse("sweeps:prefork:1+batches:threads:64@1000")]
PROBE_THREADS = [64, 128]


def test_every_measurement_has_its_own_bucket():
    steps = [step for round_ in _plan(LAYOUTS, 4, PROBE_THREADS) for step in round_]
    assert len({step.bucket for step in steps}) == len(steps)


def test_each_round_holds_every_probe_and_every_candidate_layout():
    plan = _plan(LAYOUTS, 3, PROBE_THREADS)
    assert len(plan) == 3
    for round_, steps in enumerate(plan):
        assert sorted(s.probe_threads for s in steps if s.probe_threads) == PROBE_THREADS
        layouts = [s.layout for s in steps if not s.probe_threads]
        # Celery's defaults are the reference point: measured in the first round only.
        assert layouts == ([0, 1] if round_ == 0 else [1])


def test_probes_go_first_in_even_rounds_and_last_in_odd_ones():
    for round_, steps in enumerate(_plan(LAYOUTS, 4, PROBE_THREADS)):
        kinds = ["probe" if s.probe_threads else "pipeline" for s in steps]
        first, last = ("probe", "pipeline") if round_ % 2 == 0 else ("pipeline", "probe")
        assert kinds == sorted(kinds, key=lambda k: k != first), kinds
        assert kinds[-1] == last


def test_a_layout_can_turn_conditional_deletes_off_to_measure_their_cost():
    shipped = Layout.parse("sweeps:prefork:1+batches:threads:64@1000")
    twin = Layout.parse("sweeps:prefork:1+batches:threads:64@1000!unconditional")

    assert shipped.conditional
    assert not twin.conditional
    assert (twin.workers, twin.batch_size) == (shipped.workers, shipped.batch_size)
    assert twin.label() == shipped.label() + ", unconditional deletes"
