"""The sweep as plain functions on a real Redis: slicing, checkpoints, crash and resume."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from digest_cleanup.errors import RunStateError
from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.pipeline import sweep_phases
from digest_cleanup.pipeline.lifecycle import start
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.pipeline.sweep import on_slice_error, sweep_slice
from digest_cleanup.settings import Settings
from digest_cleanup.targets import parse_targets
from digest_cleanup.testing import memory
from digest_cleanup.testing.dispatcher import recording

CUTOFF = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
TARGETS = """
[targets.snapshots]
kind = "digest_cleanup.testing.memory:MemoryKind"
store = "sweep"
prefix = "snap/"
page_size = 100
retention_days = 0
schedule = "0 3 * * 0"
batch_size = 50
"""


class Crash(Exception):
    """Stands in for a worker dying in the middle of a sweep slice."""


@pytest.fixture
def runtime(redis_url: str) -> Iterator[Runtime]:
    memory.reset("sweep")
    memory.seed("sweep", {f"snap/{i:05d}": CUTOFF - timedelta(days=1) for i in range(1000)})
    memory.seed("sweep", {f"snap/z{i:04d}": CUTOFF + timedelta(days=1) for i in range(30)})
    runtime = Runtime(Settings(broker_url=redis_url), parse_targets(TARGETS))
    yield runtime
    runtime.close()
    memory.reset("sweep")


def _crash_and_resume(runtime: Runtime, run_id: str, crash_at: int) -> tuple[list, list]:
    """Run a slice that dies after publishing ``crash_at`` batches, then its redelivery."""
    published: list[BatchPayload] = []

    def crashing(payload: BatchPayload) -> None:
        published.append(payload)
        if len(published) == crash_at:
            raise Crash

    with pytest.raises(Crash):
        sweep_slice(recording(runtime, crashing), run_id)
    runtime.store.redis.delete(runtime.store.run_key(run_id, "sweep_lease"))
    resumed: list[BatchPayload] = []
    assert sweep_slice(recording(runtime, resumed.append), run_id) == "done"
    return published, resumed


def _assert_every_batch_once_in_the_run(runtime: Runtime, run_id: str, sent: list) -> None:
    assert {p.batch_id for p in sent} == {f"{run_id}-b{n:05d}" for n in range(1, 21)}
    by_id: dict[str, list[str]] = {}
    for p in sent:  # a batch published twice has the same items both times
        assert by_id.setdefault(p.batch_id, p.keys) == p.keys
    assert sorted(i for keys in by_id.values() for i in keys) == [
        f"snap/{i:05d}" for i in range(1000)
    ]
    run = runtime.store.runs.get(run_id)
    assert (run.count("batches"), run.count("inflight")) == (20, 20)
    assert (run.count("listed"), run.count("expired")) == (1030, 1000)
    assert run.fields.get("sweep_done") == "1"


def test_a_crashed_sweep_resumes_from_its_checkpoint_and_loses_no_batch(runtime):
    # Given a run whose sweep dies right after publishing its seventh batch
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id

    # When the redelivered slice runs again
    published, resumed = _crash_and_resume(runtime, run_id, crash_at=7)

    # Then every batch was published, and only the chunk counted in flight when it
    # died went out twice: the seven it had sent
    sent = published + resumed
    _assert_every_batch_once_in_the_run(runtime, run_id, sent)
    twice = sorted(b for b, n in Counter(p.batch_id for p in sent).items() if n > 1)
    assert twice == [f"{run_id}-b{n:05d}" for n in range(1, 8)]
    assert sweep_phases.STAGED_READ_BATCHES >= 7


def test_a_sweep_that_lists_again_resends_only_the_chunk_in_flight(runtime, monkeypatch):
    # Given a run too big to stage, whose sweep dies after sending its seventh batch
    # while it drains a window refilled from the second listing
    monkeypatch.setattr(sweep_phases, "STAGE_LIMIT", 150)
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id

    published, resumed = _crash_and_resume(runtime, run_id, crash_at=7)

    # Then it drains exactly as a staged run does: only the seven batches of the chunk
    # counted in flight when it died went out twice
    sent = published + resumed
    _assert_every_batch_once_in_the_run(runtime, run_id, sent)
    twice = sorted(b for b, n in Counter(p.batch_id for p in sent).items() if n > 1)
    assert twice == [f"{run_id}-b{n:05d}" for n in range(1, 8)]


def test_a_second_listing_refills_the_stage_a_window_at_a_time(runtime, scans, monkeypatch):
    # Given a run too big to stage, and a refill window of three batches
    monkeypatch.setattr(sweep_phases, "STAGE_LIMIT", 150)
    monkeypatch.setattr(sweep_phases, "REFILL_BATCHES", 3)
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    most_staged = 0
    real_stage = runtime.store.sweeps.stage

    def watching(rid: str, batches: list[list[str]], *, lease: str) -> int:
        nonlocal most_staged
        length = real_stage(rid, batches, lease=lease)
        most_staged = max(most_staged, length)
        return length

    monkeypatch.setattr(runtime.store.sweeps, "stage", watching)

    # When it sweeps to the end, handing over after every step
    sent = _sweep_to_end(runtime, run_id, slice_seconds=1e-9)

    # Then Redis never held more than a window (plus one page's batches), every key
    # went out once, in order, and the counters hold
    assert most_staged <= 3 + 2
    assert [i for p in sent for i in p.keys] == [f"snap/{i:05d}" for i in range(1000)]
    assert [p.seq for p in sent] == list(range(1, 21))
    run = runtime.store.runs.get(run_id)
    assert (run.count("listed"), run.count("expired"), run.count("batches")) == (1030, 1000, 20)


@pytest.mark.parametrize("stage_limit", [sweep_phases.STAGE_LIMIT, 150], ids=["staged", "listed"])
def test_a_sweep_killed_while_sending_its_last_batches_sends_them_on_resume(
    runtime, monkeypatch, stage_limit
):
    # Given a sweep that dies while publishing its twentieth and last batch
    monkeypatch.setattr(sweep_phases, "STAGE_LIMIT", stage_limit)
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id

    published, resumed = _crash_and_resume(runtime, run_id, crash_at=20)

    # Then the sweep was not marked done before that batch went out: its redelivery
    # sends it, and the run can finish
    assert published[-1].batch_id in {p.batch_id for p in resumed}
    _assert_every_batch_once_in_the_run(runtime, run_id, published + resumed)


def test_a_slice_hands_over_when_its_time_is_up(runtime):
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    sent: list[BatchPayload] = []
    results = []
    while not results or results[-1] == "continue":
        results.append(sweep_slice(recording(runtime, sent.append), run_id, slice_seconds=1e-9))

    assert results[-1] == "done"
    assert len(results) > 5  # one page per slice at this budget
    assert sorted(p.seq for p in sent) == list(range(1, 21))


def test_a_second_copy_of_a_slice_attaches_while_the_first_holds_the_lease(runtime):
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    results: list[str] = []

    def publish(_: BatchPayload) -> None:
        if not results:  # while the first slice is mid-page, a duplicate arrives
            results.append(sweep_slice(recording(runtime, publish), run_id))

    sweep_slice(recording(runtime, publish), run_id)
    assert results == ["attached"]


def _sweep_to_end(runtime: Runtime, run_id: str, **kwargs: float) -> list[BatchPayload]:
    sent: list[BatchPayload] = []
    result = "continue"
    while result == "continue":
        result = sweep_slice(recording(runtime, sent.append), run_id, **kwargs)
    assert result == "done"
    return sent


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Where each listing of the memory kind started: one entry per ``scan`` call."""
    calls: list[str | None] = []
    real = memory.MemoryKind.scan

    def counting(self, cutoff, start_after=None):  # type: ignore[no-untyped-def]
        calls.append(start_after)
        return real(self, cutoff, start_after)

    monkeypatch.setattr(memory.MemoryKind, "scan", counting)
    return calls


def test_publishing_reads_the_guard_pass_staged_pages_instead_of_listing_again(runtime, scans):
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id

    sent = _sweep_to_end(runtime, run_id)

    assert scans == [None]  # one listing, by the guard pass
    assert [p.seq for p in sent] == list(range(1, 21))
    assert [i for p in sent for i in p.keys] == [f"snap/{i:05d}" for i in range(1000)]
    run = runtime.store.runs.get(run_id)
    assert (run.count("listed"), run.count("expired"), run.count("batches")) == (1030, 1000, 20)
    # the staged pages are freed once every batch is out
    assert not runtime.store.redis.exists(runtime.store.run_key(run_id, "staged"))


def _sweep_dying_at_stage_call(
    runtime: Runtime,
    run_id: str,
    monkeypatch: pytest.MonkeyPatch,
    die_at: int,
    **kwargs: float,
) -> tuple[list[BatchPayload], list[str]]:
    """Sweep to the end; the ``die_at``-th staging kills its slice right after it staged."""
    real_stage = runtime.store.sweeps.stage
    calls = 0

    def dying_stage(rid: str, batches: list[list[str]], *, lease: str) -> int:
        nonlocal calls
        calls += 1
        length = real_stage(rid, batches, lease=lease)
        if calls == die_at:
            raise Crash
        return length

    monkeypatch.setattr(runtime.store.sweeps, "stage", dying_stage)
    sent: list[BatchPayload] = []
    results: list[str] = []
    while not results or results[-1] in ("continue", "crashed"):
        try:
            results.append(sweep_slice(recording(runtime, sent.append), run_id, **kwargs))
        except Crash:
            results.append("crashed")
            runtime.store.redis.delete(runtime.store.run_key(run_id, "sweep_lease"))
    return sent, results


def test_a_guard_slice_killed_after_staging_a_page_stages_it_once(runtime, monkeypatch):
    # Given guard slices that hand over after every page, one of which dies
    # after staging its page but before its checkpoint
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    sent, results = _sweep_dying_at_stage_call(runtime, run_id, monkeypatch, 4, slice_seconds=1e-9)

    # Then every expired item went out in exactly one batch, and the counts hold
    assert "crashed" in results
    assert results[-1] == "done"
    keys = [i for p in sent for i in p.keys]
    assert sorted(keys) == [f"snap/{i:05d}" for i in range(1000)]
    assert len(keys) == len(set(keys)) == 1000
    run = runtime.store.runs.get(run_id)
    assert (run.count("expired"), run.count("batches"), run.count("inflight")) == (1000, 20, 20)


def test_a_slice_killed_while_refilling_the_stage_never_resends_another_windows_keys(
    runtime, monkeypatch
):
    # Given a run too big to stage, refilled three batches at a time, whose slice dies
    # right after staging the first page of its second window
    monkeypatch.setattr(sweep_phases, "STAGE_LIMIT", 150)
    monkeypatch.setattr(sweep_phases, "REFILL_BATCHES", 3)
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    # the guard's one page, the first window's two, then this
    sent, results = _sweep_dying_at_stage_call(runtime, run_id, monkeypatch, 4)

    # Then a batch sent again after the crash holds the same keys as the first time,
    # and every expired key went out
    assert "crashed" in results
    _assert_every_batch_once_in_the_run(runtime, run_id, sent)


def test_past_the_stage_limit_publishing_lists_the_target_again(runtime, scans, monkeypatch):
    monkeypatch.setattr(sweep_phases, "STAGE_LIMIT", 150)
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id

    sent = _sweep_to_end(runtime, run_id)

    assert scans == [None, None]  # the guard pass, then publishing
    assert [i for p in sent for i in p.keys] == [f"snap/{i:05d}" for i in range(1000)]
    assert not runtime.store.redis.exists(runtime.store.run_key(run_id, "staged"))
    run = runtime.store.runs.get(run_id)
    assert (run.count("listed"), run.count("expired"), run.count("batches")) == (1030, 1000, 20)


def test_a_run_refused_by_max_delete_leaves_nothing_staged(runtime):
    guarded = Runtime(runtime.settings, parse_targets(TARGETS + "max_delete = 250\n"))
    try:
        run_id = start(recording(guarded), guarded.target("snapshots"), CUTOFF).run_id
        sent: list[BatchPayload] = []

        assert sweep_slice(recording(guarded, sent.append), run_id) == "failed"

        assert sent == []
        assert guarded.store.runs.get(run_id)["reason"] == "max_delete_exceeded"
        assert not guarded.store.redis.exists(guarded.store.run_key(run_id, "staged"))
    finally:
        guarded.close()


def test_staged_batches_lost_from_redis_fail_the_run_at_once(runtime):
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    sent: list[BatchPayload] = []
    # the guard pass finishes; then the staged list disappears before publishing
    while sweep_slice(recording(runtime, sent.append), run_id, slice_seconds=1e-9) == "continue":
        if runtime.store.sweeps.load_checkpoint(run_id)["phase"] == "publish":  # type: ignore[index]
            break
    runtime.store.redis.delete(runtime.store.run_key(run_id, "staged"))

    with pytest.raises(RunStateError, match="staged batches are missing") as raised:
        sweep_slice(recording(runtime, sent.append), run_id)

    # the sweep task's error handler fails the run without retrying: nothing can bring them back
    assert on_slice_error(runtime, run_id, raised.value) is None
    run = runtime.store.runs.get(run_id)
    assert (run.status, run["reason"]) == ("failed", "run_state_lost")
    assert "trigger the run again" in run["message"]


def test_a_slice_that_outran_its_lease_is_fenced_and_the_in_flight_count_stays_exact(runtime):
    # Given a run whose first slice stalls mid-publish past its lease (a long listing
    # page, say), while a redelivered copy of the slice takes the lease over
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    lease = runtime.store.run_key(run_id, "sweep_lease")
    late: list[BatchPayload] = []
    takeover: list[str] = []

    def stall_then_publish(payload: BatchPayload) -> None:
        late.append(payload)
        if len(late) == 1:
            runtime.store.redis.delete(lease)  # the lease expires while the slice stalls
            takeover.append(sweep_slice(recording(runtime, redelivered.append), run_id))

    redelivered: list[BatchPayload] = []

    # When the stalled slice goes on after the takeover
    first = sweep_slice(recording(runtime, stall_then_publish), run_id)

    # Then it is fenced at its next checkpoint, the takeover swept everything, and the
    # run counts each batch in flight once
    assert first == "fenced"
    assert takeover == ["done"]
    run = runtime.store.runs.get(run_id)
    assert run.count("batches") == 20
    assert run.count("inflight") == 20
    assert sorted({p.seq for p in redelivered}) == list(range(1, 21))


def test_a_checkpoint_clears_the_sweep_error_count(runtime):
    # Given a run whose sweep failed twice, transiently
    run_id = start(recording(runtime), runtime.target("snapshots"), CUTOFF).run_id
    for _ in range(2):
        assert on_slice_error(runtime, run_id, TimeoutError("slow page")) is not None
    assert runtime.store.runs.get(run_id).count("sweep_errors") == 2

    # When a slice then makes progress
    assert sweep_slice(recording(runtime), run_id) == "done"

    # Then the count starts over, so errors spread over a long sweep never add up to a failure
    assert runtime.store.runs.get(run_id).count("sweep_errors") == 0
