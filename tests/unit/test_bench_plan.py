"""The benchmark's plan: fresh copies, paired rounds, and an order that favours neither side."""

from __future__ import annotations

from benchmarks.pipeline import Layout
from benchmarks.run import _plan

LAYOUTS = 2
PROBE_THREADS = [64, 128]


def test_every_measurement_has_its_own_bucket():
    steps = [step for round_ in _plan(LAYOUTS, 4, PROBE_THREADS) for step in round_]
    assert len({step.bucket for step in steps}) == len(steps)


def test_each_round_holds_every_baseline_and_every_layout():
    plan = _plan(LAYOUTS, 3, PROBE_THREADS)
    assert len(plan) == 3
    for steps in plan:
        # Each probe thread count twice, sending the listed ETags and bare, and s5cmd once
        probes = sorted((s.probe_threads, s.conditional) for s in steps if s.kind == "probe")
        assert probes == [(n, c) for n in PROBE_THREADS for c in (False, True)]
        assert [s.kind for s in steps].count("s5cmd") == 1
        assert [s.layout for s in steps if s.kind == "pipeline"] == [0, 1]


def test_baselines_go_first_in_even_rounds_and_last_in_odd_ones():
    for round_, steps in enumerate(_plan(LAYOUTS, 4, PROBE_THREADS)):
        kinds = ["pipeline" if s.kind == "pipeline" else "baseline" for s in steps]
        first, last = ("baseline", "pipeline") if round_ % 2 == 0 else ("pipeline", "baseline")
        assert kinds == sorted(kinds, key=lambda k: k != first), kinds
        assert kinds[-1] == last


def test_a_layout_can_turn_conditional_deletes_off_to_measure_their_cost():
    shipped = Layout.parse("sweeps:prefork:1+batches:threads:64@1000")
    twin = Layout.parse("sweeps:prefork:1+batches:threads:64@1000!unconditional")

    assert shipped.conditional
    assert not twin.conditional
    assert (twin.workers, twin.batch_size) == (shipped.workers, shipped.batch_size)
    assert twin.label() == shipped.label() + ", unconditional deletes"
