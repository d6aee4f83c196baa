"""End to end: a PostgreSQL target cleaned by the same pipeline, workers and CLI as S3.

Real ``celery worker`` processes, the session's Redis, a real PostgreSQL (see
``tests/postgres_fixture.py``) and the S3 server for the audit report.  The
workers connect as a role of their own, so privileges are real privileges.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.rig.stack import Stack, wait_for

pytestmark = pytest.mark.e2e
pytest_plugins = ["tests.postgres_fixture"]

ROWS = 50_000
#: Ids start above this, so no id can pass for a batch number or a count in a label.
ID_BASE = 10_000_000
#: Every fifth row is fresh; the other 40,000 are two months old.
FRESH_EVERY = 5
#: Rows rewritten between the sweep and the batches: one in every thousand, all expired.
REWRITTEN = [ID_BASE + i for i in range(1, ROWS + 1) if i % 1000 == 1]

Admin = psycopg.Connection[tuple[Any, ...]]
MakeRole = Callable[..., str]


@pytest.fixture
def admin(postgres_dsn: str) -> Iterator[Admin]:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def make_role(admin: Admin, postgres_dsn: str) -> Iterator[MakeRole]:
    """Create login roles holding only the given privileges on a table; return their DSN.

    Tests request it before ``make_stack``, so the workers stop before their role is dropped.
    """
    roles: list[str] = []

    def make(table: str, privileges: str) -> str:
        role, password = f"dc_worker_{secrets.token_hex(4)}", secrets.token_hex(12)
        admin.execute(
            sql.SQL("CREATE ROLE {r} LOGIN PASSWORD {p}").format(
                r=sql.Identifier(role), p=sql.Literal(password)
            )
        )
        roles.append(role)
        admin.execute(
            sql.SQL("GRANT {privileges} ON {t} TO {r}").format(
                privileges=sql.SQL(privileges), t=sql.Identifier(table), r=sql.Identifier(role)
            )
        )
        return make_conninfo(postgres_dsn, user=role, password=password)

    yield make
    for role in roles:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        admin.execute(sql.SQL("DROP OWNED BY {r}").format(r=sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {r}").format(r=sql.Identifier(role)))


def create_table(admin: Admin, prefix: str, rows: int) -> str:
    """``rows`` rows keyed by bigint, every FRESH_EVERY-th one fresh, in one statement."""
    table = f"{prefix}_{secrets.token_hex(4)}"
    admin.execute(
        sql.SQL(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, customer text NOT NULL,"
            " updated_at timestamptz NOT NULL)"
        ).format(t=sql.Identifier(table))
    )
    admin.execute(
        sql.SQL(
            "INSERT INTO {t} SELECT %s + g, 'customer-' || g,"
            " CASE WHEN g %% %s = 0 THEN now() - interval '1 day'"
            " ELSE now() - interval '60 days' END"
            " FROM generate_series(1, %s) AS g"
        ).format(t=sql.Identifier(table)),
        [ID_BASE, FRESH_EVERY, rows],
    )
    return table


def postgres_target(name: str, table: str, dsn_env: str, **extra: Any) -> str:
    lines = [
        f"[targets.{name}]",
        'kind = "postgres"',
        f'table = "{table}"',
        'primary_key = "id"',
        'timestamp_column = "updated_at"',
        f'dsn_env = "{dsn_env}"',
        "retention_days = 30",
        'schedule = "0 3 * * 0"',
        *(f"{key} = {value}" for key, value in extra.items()),
    ]
    return "\n".join(lines) + "\n"


def scalar(admin: Admin, query: sql.Composable, *params: Any) -> Any:
    row = admin.execute(query, list(params)).fetchone()
    assert row is not None
    return row[0]


def queued(stack: Stack, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in ``queue``, oldest first, without consuming them."""
    client = redis.Redis.from_url(stack.env["CLEANUP_BROKER_URL"])
    try:
        return [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]
    finally:
        client.close()


def items_of(message: dict[str, Any]) -> list[str]:
    _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    return [kwargs["base"] + rest for rest in kwargs["rest"]]


def test_expired_rows_are_deleted_fresh_and_rewritten_rows_kept_and_the_run_reported(
    admin: Admin,
    make_role: MakeRole,
    make_stack: Callable[..., Stack],
    weed: Any,
    s3: Any,
    bucket: str,
) -> None:
    # Given 50,000 rows, 40,000 of them expired, and a role that may read and delete them
    table = create_table(admin, "snapshots", ROWS)
    dsn = make_role(table, "SELECT, DELETE")
    password = conninfo_to_dict(dsn)["password"]
    t = sql.Identifier(table)
    fresh_rows = sql.SQL(
        "SELECT md5(string_agg(id || '/' || customer || '/' || updated_at, ',' ORDER BY id))"
        " FROM {t} WHERE (id - {base}) %% {n} = 0"
    ).format(t=t, base=sql.Literal(ID_BASE), n=sql.Literal(FRESH_EVERY))
    fresh_before = scalar(admin, fresh_rows)
    stack = make_stack(
        postgres_target("snapshots", table, "CLEANUP_SNAPSHOTS_DSN", batch_size=1000),
        env={"CLEANUP_SNAPSHOTS_DSN": dsn, "CLEANUP_AUDIT_URL": f"s3://{bucket}/reports/"},
        direct_s3=weed.endpoint_url,
    )

    # When the run starts with a worker for sweeps only, so every batch waits in its queue
    stack.worker(queues="sweeps", concurrency=1)
    started = stack.cli("run", "snapshots", "--json")
    assert started.code == 0, started
    run_id, cutoff = started.json()["run_id"], started.json()["cutoff"]
    store = Runtime(Settings.from_env(stack.env)).store
    wait_for(
        lambda: store.runs.get(run_id).fields.get("sweep_done") == "1", 120, "the sweep to finish"
    )

    # Then each batch is a delete_batch task named by its batch id, labelled without row ids
    messages = queued(stack, "batches")
    assert len(messages) == 40
    for seq, message in enumerate(messages, start=1):
        headers = message["headers"]
        assert headers["task"] == "digest_cleanup.delete_batch"
        assert headers["id"] == f"{run_id}-b{seq:05d}"
        assert headers["kwargsrepr"] == "{...}"
        assert headers["argsrepr"].startswith("snapshots ")
        assert not [i for i in items_of(message) if i in headers["argsrepr"]], headers["argsrepr"]
    listed = [key for message in messages for key in items_of(message)]
    assert len(listed) == len(set(listed)) == 40_000
    assert {str(i) for i in REWRITTEN} <= set(listed)

    # When 50 listed rows are rewritten before any batch runs, then batch workers start
    admin.execute(
        sql.SQL("UPDATE {t} SET updated_at = now() WHERE id = ANY(%s)").format(t=t), [REWRITTEN]
    )
    stack.worker(queues="batches", concurrency=2)
    result = stack.cli("run", "snapshots", "--cutoff", cutoff, "--wait", "--json")

    # Then the run attaches, and every expired row is accounted for exactly once
    assert result.code == 0, result
    run = result.json()
    assert (run["run_id"], run["action"], run["status"]) == (run_id, "attached", "complete")
    assert (run["listed"], run["expired"], run["batches"]) == (ROWS, 40_000, 40)
    assert (run["deleted"], run["skipped"], run["dead_lettered"]) == (39_950, 50, 0)
    assert run["expired"] == run["deleted"] + run["dead_lettered"] + run["skipped"]
    assert (run["kind"], run["location"]) == ("postgres", f"postgres://{table}")

    # And the table holds exactly the fresh rows, untouched, and the rewritten ones
    remaining = admin.execute(sql.SQL("SELECT id FROM {t} ORDER BY id").format(t=t)).fetchall()
    fresh_ids = [ID_BASE + i for i in range(1, ROWS + 1) if i % FRESH_EVERY == 0]
    assert [r[0] for r in remaining] == sorted(fresh_ids + REWRITTEN)
    assert scalar(admin, fresh_rows) == fresh_before
    verify = stack.cli("verify", "snapshots", "--cutoff", cutoff, "--json")
    assert verify.code == 0, verify
    assert verify.json()["remaining_expired"] == 0

    # And the audit report sits in S3 where the run says, and adds up
    prefix = run["report_url"].removeprefix(f"s3://{bucket}/")
    assert prefix.startswith(f"reports/snapshots/{run_id}/")
    summary = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "summary.json")["Body"].read())
    assert summary["accounting"]["balanced"] is True
    assert (summary["expired"], summary["skipped"]) == (40_000, 50)
    assert summary["location"] == f"postgres://{table}"
    rows = s3.get_object(Bucket=bucket, Key=prefix + "not_deleted.jsonl")["Body"].read()
    kept = [json.loads(line) for line in rows.decode().splitlines()]
    assert sorted((int(r["key"]), r["code"]) for r in kept) == [
        (i, "changed_since_listing") for i in sorted(REWRITTEN)
    ]

    # And the role's password shows up in no output and no worker log
    targets = stack.cli("targets", "--json")
    (listed_target,) = targets.json()["targets"]
    assert listed_target["location"] == f"postgres://{table}"
    outputs = [started.stdout, started.stderr, result.stdout, result.stderr, targets.stdout]
    outputs += [process.output() for process in stack.processes]
    assert not [text for text in outputs if password in text]


def test_rows_the_role_may_not_delete_are_dead_lettered_as_permission_denied(
    admin: Admin, make_role: MakeRole, make_stack: Callable[..., Stack]
) -> None:
    # Given 300 rows, 240 of them expired, and a role that may read them but not delete
    table = create_table(admin, "receipts", 300)
    dsn = make_role(table, "SELECT")
    stack = make_stack(
        postgres_target("receipts", table, "CLEANUP_RECEIPTS_DSN", batch_size=100),
        env={"CLEANUP_RECEIPTS_DSN": dsn},
    )
    stack.worker(concurrency=1)

    # When the run is waited for
    result = stack.cli("run", "receipts", "--wait", "--json")

    # Then every expired row is dead-lettered once as permission_denied, never retried
    assert result.code == 1, result
    run = result.json()
    assert run["status"] == "complete_with_failures"
    assert (run["expired"], run["dead_lettered"], run["deleted"]) == (240, 240, 0)
    assert run["retries"] == 0
    entries = stack.cli("dlq", "list", "--target", "receipts", "--json").json()["entries"]
    expired_ids = {str(ID_BASE + i) for i in range(1, 301) if i % FRESH_EVERY != 0}
    codes = {k["key"]: k["code"] for e in entries for k in e["keys"]}
    assert codes == dict.fromkeys(expired_ids, "permission_denied")
    assert {e["reason"] for e in entries} == {"permanent_error"}
    assert {e["run_id"] for e in entries} == {run["run_id"]}

    # And the entries carry the same identifier-free labels as the batches (read where
    # the dead-letter index keeps the messages once a listing has absorbed them)
    client = redis.Redis.from_url(stack.env["CLEANUP_BROKER_URL"])
    dead = [json.loads(raw) for raw in client.hvals("dc:dlq:entries")]
    assert len(dead) == len(entries) == 3
    for message in dead:
        label = message["headers"]["argsrepr"]
        assert label.startswith("dead letter: receipts ")
        assert not [i for i in items_of(message) if i in label], label

    # And nothing was deleted
    assert scalar(admin, sql.SQL("SELECT count(*) FROM {t}").format(t=sql.Identifier(table))) == 300
