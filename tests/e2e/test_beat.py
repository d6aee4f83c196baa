"""Beat fires each slot once: two beats, a restarted beat and a missed slot, on real processes.

The guarantee is a run id keyed on the slot plus a claim on the slot in Redis
(``dc:slot:TARGET:YYYYMMDDTHHMMZ``), taken by the ``digest_cleanup.trigger``
task.  Beats run at DEBUG, where Celery logs the id of every task its schedule
sends; catch-up triggers (sent on ``beat_init``) are not in that list, so the
tests can tell the two apart in the worker's log.
"""

from __future__ import annotations

import ast
import re
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from digest_cleanup.pipeline.lifecycle import run_id_for
from digest_cleanup.store.runs import RunStore
from tests.rig.stack import Process, Stack, wait_for

pytestmark = pytest.mark.e2e

RETENTION_DAYS = 30
#: Celery's DEBUG lines carry the ids of the tasks beat's own schedule sends.
DEBUG = ("--loglevel=DEBUG",)
#: Generous: a slow, shared machine may take a while to start a beat and a worker.
TIMEOUT = 60.0
_RESULT = re.compile(r"Task digest_cleanup\.trigger\[([^\]]+)\] succeeded in \S+: (\{.*\})")
_SENT = re.compile(r"digest_cleanup\.trigger sent\. id->([0-9a-f-]+)")


def _targets(bucket: str, name: str, schedule: str) -> str:
    return (
        f"[targets.{name}]\n"
        f'bucket = "{bucket}"\n'
        'prefix = "statements/"\n'
        f"retention_days = {RETENTION_DAYS}\n"
        f'schedule = "{schedule}"\n'
    )


def _results(worker: Process) -> dict[str, dict[str, Any]]:
    """Every trigger the worker ran, by task id, with what it returned."""
    return {
        task_id: ast.literal_eval(result) for task_id, result in _RESULT.findall(worker.output())
    }


def _sent(beat: Process) -> list[str]:
    """Ids of the triggers this beat's schedule sent (catch-ups are not among them)."""
    return _SENT.findall(beat.output())


def _ticked(beat: Process) -> bool:
    """True once beat finished its first tick: anything due at start has been sent by then."""
    return "beat: Waking up" in beat.output()


def _runs(client: redis.Redis, target: str) -> list[str]:
    store = RunStore(client)
    return sorted(
        run_id
        for run_id in store.runs.run_ids(limit=100)
        if (run := store.runs.find(run_id)) and run.fields.get("target") == target
    )


def _run_for(target: str, slot: str | datetime) -> str:
    at = datetime.fromisoformat(slot) if isinstance(slot, str) else slot
    return run_id_for(target, at - timedelta(days=RETENTION_DAYS))


def _schedule_file_of(beat: Process) -> Path:
    return Path(next(a for a in beat.argv if a.startswith("--schedule=")).partition("=")[2])


def test_two_beats_at_once_give_exactly_one_run_per_slot(make_stack, bucket, redis_client):
    # Given a target due every minute, a worker, and two beats with their own schedule files
    stack = make_stack(_targets(bucket, "minutely", "* * * * *"))
    worker = stack.worker(concurrency=2)
    beats = [stack.beat(name="beat-a", extra=DEBUG), stack.beat(name="beat-b", extra=DEBUG)]

    # When both fire for the same slot at a minute boundary, and the worker took every trigger
    def both_fired() -> dict[str, dict[str, Any]] | None:
        sent = [_sent(beat) for beat in beats]
        results = _results(worker)
        ids = {i for ids in sent for i in ids}
        if not ids <= set(results) or len(results) < 2 + len(ids):
            return None
        slots = [{results[i]["slot"] for i in ids} for ids in sent]
        return results if slots[0] & slots[1] else None

    results = wait_for(both_fired, 70 + TIMEOUT, "both beats to fire at a minute boundary")

    # Then the worker ran nothing but the two catch-ups and what the schedules sent
    sent = [i for beat in beats for i in _sent(beat)]
    assert len(results) == 2 + len(sent), results
    # and every slot was claimed once: one run created, every other trigger for it refused
    actions: dict[str, list[str]] = defaultdict(list)
    for result in results.values():
        actions[result["slot"]].append(result["action"])
    for slot, taken in actions.items():
        assert sorted(taken) == ["already_locked"] * (len(taken) - 1) + ["created"], slot
    # and the run store holds exactly one run per slot, named after the slot
    assert _runs(redis_client, "minutely") == sorted(_run_for("minutely", s) for s in actions)
    assert len(redis_client.keys("dc:slot:minutely:*")) == len(actions)


def test_a_missed_slot_runs_once_however_many_beats_start(
    make_stack, bucket, redis_client, tmp_path
):
    # Given a weekly target whose slot passed a day ago, with no run for it yet
    slot = (datetime.now(UTC) - timedelta(days=1)).replace(second=0, microsecond=0)
    weekly = f"{slot.minute} {slot.hour} * * {slot.isoweekday() % 7}"
    stack = make_stack(_targets(bucket, "weekly", weekly))
    worker = stack.worker(concurrency=2)
    expected = _run_for("weekly", slot)

    # When a beat starts with a fresh schedule file
    beat_a = stack.beat(name="beat-a", extra=DEBUG)
    wait_for(lambda: _ticked(beat_a) and len(_results(worker)) >= 1, TIMEOUT, "the catch-up")

    # Then its catch-up starts exactly the slot's run (Celery itself sends nothing)
    assert [r["action"] for r in _results(worker).values()] == ["created"]
    assert _runs(redis_client, "weekly") == [expected]
    assert _sent(beat_a) == []

    # When a second beat starts whose schedule file last ran before the slot, as a
    # beat down over the slot leaves it: Celery fires the missed slot itself
    beat_b_file = tmp_path / "beat-b-schedule"
    _schedule_file_last_run(stack, beat_b_file, slot - timedelta(hours=1))
    beat_b = stack.beat(name="beat-b", schedule=beat_b_file, extra=DEBUG)
    wait_for(lambda: _ticked(beat_b) and len(_results(worker)) >= 3, TIMEOUT, "beat b's triggers")

    # Then both its triggers, Celery's and the catch-up, find the slot locked
    assert len(_sent(beat_b)) == 1
    assert _results(worker)[_sent(beat_b)[0]]["action"] == "already_locked"

    # When the first beat restarts with its own schedule file
    schedule_a = _schedule_file_of(beat_a)
    beat_a.terminate()
    beat_a = stack.beat(name="beat-a", schedule=schedule_a, extra=DEBUG)
    wait_for(lambda: _ticked(beat_a) and len(_results(worker)) >= 4, TIMEOUT, "the restart")

    # Then nothing new runs: four triggers for the one slot, one run
    results = list(_results(worker).values())
    assert {r["slot"] for r in results} == {slot.isoformat()}
    assert sorted(r["action"] for r in results) == ["already_locked"] * 3 + ["created"]
    assert _sent(beat_a) == []
    assert _runs(redis_client, "weekly") == [expected]
    run = RunStore(redis_client).runs.get(expected)
    assert run.fields["trigger"] == "beat-catch-up"
    assert run.fields["cutoff"] == (slot - timedelta(days=RETENTION_DAYS)).isoformat()


def test_a_redelivered_trigger_still_starts_the_run_it_claimed(make_stack, bucket, redis_client):
    # Given a trigger whose first delivery claimed its slot, then died before starting the run
    slot = (datetime.now(UTC) - timedelta(days=1)).replace(second=0, microsecond=0)
    weekly = f"{slot.minute} {slot.hour} * * {slot.isoweekday() % 7}"
    stack = make_stack(_targets(bucket, "weekly", weekly))
    worker = stack.worker(concurrency=1)
    task_id = str(uuid.uuid4())
    redis_client.set(f"dc:slot:weekly:{slot:%Y%m%dT%H%MZ}", task_id)

    # When the same message is delivered again, and another trigger comes for the slot
    _send_trigger(stack, task_id)
    wait_for(lambda: task_id in _results(worker), TIMEOUT, "the redelivered trigger")
    other = str(uuid.uuid4())
    _send_trigger(stack, other)
    wait_for(lambda: other in _results(worker), TIMEOUT, "the other trigger")

    # Then the redelivery starts the slot's run instead of skipping it, and only once
    results = _results(worker)
    assert results[task_id]["action"] == "created"
    assert results[other]["action"] == "already_locked"
    assert _runs(redis_client, "weekly") == [_run_for("weekly", slot)]


def _send_trigger(stack: Stack, task_id: str) -> None:
    from digest_cleanup.app import create_app
    from digest_cleanup.pipeline.messaging import SWEEP_QUEUE
    from digest_cleanup.settings import Settings

    app = create_app(Settings.from_env(stack.env))
    app.send_task(
        "digest_cleanup.trigger",
        args=["weekly"],
        kwargs={"catch_up": True},
        task_id=task_id,
        queue=SWEEP_QUEUE,
    )


def _schedule_file_last_run(stack: Stack, path: Path, last_run_at: datetime) -> None:
    """Write, with Celery's own scheduler, a schedule file whose entries last ran then."""
    from celery.beat import PersistentScheduler

    from digest_cleanup.app import create_app
    from digest_cleanup.beat_schedule import build_schedule
    from digest_cleanup.settings import Settings
    from digest_cleanup.targets import load_targets

    settings = Settings.from_env(stack.env)
    targets = load_targets(settings.targets_file)
    app = create_app(settings, targets)
    app.conf.beat_schedule = build_schedule(targets)
    scheduler = PersistentScheduler(app=app, schedule_filename=str(path))
    for entry in scheduler.schedule.values():
        entry.last_run_at = last_run_at
    scheduler.close()
