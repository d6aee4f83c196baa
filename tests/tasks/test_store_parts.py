"""The store's parts on a real Redis: every Lua script runs through a part's method.

Each call checks its keys and arguments against the script's header (a wrong or
missing name raises before Redis is called), so one pass through every
transition shows that the names the Python side passes are the ones each script
declares, and that every script in the package is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from digest_cleanup.app import create_app
from digest_cleanup.kinds import KeyResult, Outcome
from digest_cleanup.model.batches import BatchPayload, BatchRecord
from digest_cleanup.model.dead_letters import index_headers, make_entry
from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from digest_cleanup.store import scripts
from digest_cleanup.store.keys import RUN_KEY_SUFFIXES, Keys
from digest_cleanup.store.scripts import Script

TARGET = "statements"


@pytest.fixture
def runtime(redis_url: str) -> Iterator[Runtime]:
    rt = Runtime(Settings(broker_url=redis_url))
    yield rt
    rt.close()


@pytest.fixture
def called(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The scripts run, by file name, in order."""
    names: list[str] = []
    run = Script.__call__

    def recording(self: Script, **kwargs: Any) -> Any:
        result = run(self, **kwargs)
        names.append(self.source.name)
        return result

    monkeypatch.setattr(Script, "__call__", recording)
    return names


def _payload(run_id: str, keys: list[str]) -> BatchPayload:
    return BatchPayload(
        run_id=run_id,
        target=TARGET,
        batch_id=f"{run_id}-b00001",
        seq=1,
        cutoff="2026-10-25T03:00:00+00:00",
        keys=keys,
        scope="s",
    )


def _dead_letter(app: Any, entry_id: str, run_id: str, keys: list[str], headers: bool) -> None:
    dead = {k: KeyResult(k, Outcome.PERMANENT, "AccessDenied") for k in keys}
    body = make_entry(_payload(run_id, keys), dead, "permanent_error").body
    app.send_task(
        "digest_cleanup.delete_batch",
        kwargs=body,
        task_id=entry_id,
        queue="dead_letter",
        headers=index_headers(body) if headers else None,
    )


def test_every_script_runs_through_a_part_with_the_names_its_header_declares(runtime, called):
    store = runtime.store
    # Given a run swept in one checkpoint: staged, trimmed, published
    run = "statements-20261129T0300Z"
    assert store.runs.open(run, {"target": TARGET}) == "created"
    lease = store.sweeps.take_lease(run, 30)
    assert lease is not None
    assert store.sweeps.stage(run, [["statements/a.pdf"]], lease=lease) == 1
    store.sweeps.keep_staged(run, 0, lease=lease)
    batch = f"{run}-b00001"
    checkpoint = {"listed": 1, "expired": 1, "seq": 1, "done": True}
    saved = store.sweeps.save_checkpoint(
        run, checkpoint, {batch: b"digest"}, lease=lease, lease_seconds=30
    )
    assert saved == "saved"

    # When its one batch is delivered twice and recorded, the run finishes
    assert store.runs.count_delivery(run, f"{batch}/0/0") == 1
    assert store.runs.count_delivery(run, f"{batch}/0/0") == 2
    record = BatchRecord(batch_id=batch, claim=f"{batch}/0/0", deleted=1, latency=0.2, keys=1)
    assert store.runs.record(run, TARGET, record) == "finished"
    assert store.runs.get(run).status == "complete"

    # and two more runs end the other two ways
    for other in ("failing", "aborting"):
        store.runs.open(other, {"target": TARGET})
    assert store.runs.fail("failing", "listing_failed", "the listing failed")
    assert store.runs.abort("aborting", "an operator stopped it") == "aborted"

    # and dead letters arrive indexed, without headers, and as a merge; one is redriven
    # into its run and one purged
    app = create_app(runtime.settings)
    dlq = runtime.dead_letters
    _dead_letter(app, "dl-1", run, ["statements/a.pdf"], headers=True)
    _dead_letter(app, "dl-2", run, ["statements/b.pdf"], headers=False)
    _dead_letter(app, "dl-2", run, ["statements/c.pdf"], headers=False)
    first, second = sorted(dlq.entries(), key=lambda e: e.id)
    assert sorted(second.keys) == ["statements/b.pdf", "statements/c.pdf"]
    assert dlq.redrive_one(first)
    assert len(dlq.purge([second], "dlq purge dl-2")) == 1

    # and the target's delete budget is drawn on, throttled and read
    budget = store.budget(TARGET, 1000.0)
    assert budget.reserve(10, max_wait=5).granted
    assert budget.throttled() < 1000.0
    assert budget.state().throttles == 1

    # Then every script of the package ran, each through the store's own method
    assert set(called) == {n for n in scripts.names() if not scripts.is_fragment(n)}


def test_the_parts_share_one_client_and_one_keyspace(runtime):
    store = runtime.store
    dlq = runtime.dead_letters
    budget = store.budget(TARGET, 1000.0)
    for part in (store.runs, store.sweeps, store.targets, store.clock_skews, dlq):
        assert part.client is store.redis
        assert part.keys is store.keys
    assert budget.redis is store.redis
    # and their key names are the schema's, under the one prefix
    assert budget.key == store.keys.budget(TARGET) == "dc:budget:statements"
    assert dlq.audit_key == store.keys.audit() == "dc:audit"
    assert store.run_key("r", "pending") == store.keys.run("r", "pending") == "dc:run:r:pending"


def test_a_redrive_moves_the_run_counters_through_the_run_part(runtime):
    # Given a finished run whose one batch dead-lettered its key
    store = runtime.store
    run = "statements-20261206T0300Z"
    store.runs.open(run, {"target": TARGET})
    lease = store.sweeps.take_lease(run, 30)
    assert lease is not None
    batch = f"{run}-b00001"
    checkpoint = {"listed": 1, "expired": 1, "seq": 1, "done": True}
    store.sweeps.save_checkpoint(run, checkpoint, {batch: b"d"}, lease=lease, lease_seconds=30)
    dead = BatchRecord(batch_id=batch, claim=f"{batch}/0/0", dead_lettered=1, keys=1)
    assert store.runs.record(run, TARGET, dead) == "finished"
    _dead_letter(create_app(runtime.settings), "dl-r", run, ["statements/a.pdf"], headers=True)
    (entry,) = runtime.dead_letters.entries(run=run)

    # When an operator redrives it
    assert runtime.dead_letters.redrive_one(entry)

    # Then the run is running again with one more chain in flight, the key counted redriven
    view = store.runs.get(run)
    assert view.status == "running"
    assert (view.count("redriven"), view.count("dead_lettered"), view.count("inflight")) == (
        1,
        0,
        1,
    )
    assert store.runs.is_in_flight(run, batch)
    assert store.runs.is_redriven(run, batch)
    assert json.loads(store.redis.lindex("batches", 0))["headers"]["id"] == "dl-r"


def test_the_key_names_are_those_a_running_deployment_already_holds():
    # A Redis upgraded in place keeps its runs, leases, locks and dead letters under these
    keys = Keys("dc")
    assert [
        keys.run("R"),
        keys.run("R", "sweep_lease"),
        keys.sweep_lease("R"),
        keys.runs(),
        keys.latest("T"),
        keys.latency("T"),
        keys.timings("T"),
        keys.slot("T", "S"),
        keys.target("T", "last_success"),
        keys.target("T", "probed"),
        keys.target("T", "verify"),
        keys.dead_letters("entries"),
        keys.dead_letters("run", "R"),
        keys.dead_letters(),
        keys.audit(),
        keys.budget("T"),
        keys.clock_skews(),
    ] == [
        "dc:run:R",
        "dc:run:R:sweep_lease",
        "dc:run:R:sweep_lease",
        "dc:runs",
        "dc:target:T:latest",
        "dc:latency:T",
        "dc:timings:T",
        "dc:slot:T:S",
        "dc:target:T:last_success",
        "dc:target:T:probed",
        "dc:target:T:verify",
        "dc:dlq:entries",
        "dc:dlq:run:R",
        "dc:dlq:",
        "dc:audit",
        "dc:budget:T",
        "dc:clock_skew",
    ]
    assert set(RUN_KEY_SUFFIXES) == {
        "", "checkpoint", "claims", "pending", "retry_codes", "retried_codes", "deliveries",
        "staged", "skipped_keys", "sweep_lease", "progress", "published", "redriven", "chains",
    }  # fmt: skip
