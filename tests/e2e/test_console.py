"""The console on the real stack: auth, CSRF, read-only viewers, and a real run listed.

The console runs as ``digest-cleanup console`` in its own process, against the
suite's Redis and a worker deleting from the S3 server; requests are plain
``urllib``, so these tests need no browser (the browser tests drive the pages).
"""

from __future__ import annotations

import base64
import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import Any

import pytest

from digest_cleanup.pipeline.runtime import Runtime
from digest_cleanup.settings import Settings
from tests.conftest import s3_targets, seed_split
from tests.rig.stack import Process, Stack, wait_for

pytestmark = pytest.mark.e2e

ADMIN, VIEWER = ("ops", "s3cret-admin:pw"), ("watcher", "look-only")
AUTH_ENV = {
    "CLEANUP_CONSOLE_AUTH": f"{ADMIN[0]}:{ADMIN[1]}",
    "CLEANUP_CONSOLE_VIEWERS": f"{VIEWER[0]}:{VIEWER[1]}",
}
KEYS = [f"statements/2026-10-18/cust-{i:04d}.pdf" for i in range(40)]
DENIED = {KEYS[3], KEYS[17]}


class Client:
    """A browser's worth of HTTP: basic auth, a cookie jar, forms posted as they are."""

    def __init__(self, base: str, user: tuple[str, str] | None) -> None:
        self.base = base
        self.user = user
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def request(
        self, path: str, data: dict[str, Any] | None = None, user: tuple[str, str] | None = None
    ) -> tuple[int, Message, str]:
        body = urllib.parse.urlencode(data, doseq=True).encode() if data is not None else None
        req = urllib.request.Request(self.base + path, data=body)  # noqa: S310 (loopback)
        user = user or self.user
        if user:
            token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with self.opener.open(req, timeout=30) as resp:
                return resp.status, resp.headers, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read().decode()


def _xsrf(page: str) -> str:
    match = re.search(r'name="_xsrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


def _console(stack: Stack, *args: str, env: dict[str, str] | None = None) -> tuple[Process, str]:
    proc = stack.start("console", [stack.executable("digest-cleanup"), "console", "--port",
                                   "0", *args], {**AUTH_ENV, **(env or {})})  # fmt: skip
    proc.wait_ready("console listening on ")
    url = re.search(r"console listening on (http://\S+)/", proc.output())
    assert url, proc.output()
    return proc, url.group(1)


@pytest.fixture
def denied_run(make_stack: Any, s3: Any, bucket: str, proxy: Any) -> tuple[Stack, dict[str, Any]]:
    """A finished run in which S3 denied two keys: they wait in the dead-letter queue."""
    cutoff = seed_split(s3, bucket, KEYS, [])
    proxy.deny_keys = set(DENIED)
    stack = make_stack(s3_targets(bucket, batch_size=10))
    stack.worker()
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json")
    assert run.json()["status"] == "complete_with_failures", run
    return stack, run.json()


def test_without_an_admin_the_console_refuses_to_start(make_stack, bucket):
    # Given no CLEANUP_CONSOLE_AUTH
    stack = make_stack(s3_targets(bucket))
    # When the console is started
    result = stack.cli("console", "--port", "0", timeout=30)
    # Then it exits 2 with one line saying how to set it
    assert result.code == 2, result
    assert result.stderr.strip().splitlines() == [
        "digest-cleanup: error: CLEANUP_CONSOLE_AUTH is not set; the console never runs open: "
        "set CLEANUP_CONSOLE_AUTH=user:password (and optionally "
        "CLEANUP_CONSOLE_VIEWERS=user:pw,... for read-only users)"
    ]
    bad = stack.cli("console", env={"CLEANUP_CONSOLE_AUTH": "nopassword"}, timeout=30)
    assert bad.code == 2, bad
    assert "CLEANUP_CONSOLE_AUTH" in bad.stderr, bad


def test_auth_is_never_open_and_a_real_run_is_listed(denied_run):
    stack, run = denied_run
    proc, base = _console(stack)
    # The default binds loopback only
    assert base.startswith("http://127.0.0.1:"), base

    # A request without credentials, or with a wrong password, gets 401 and the challenge
    for user in (None, (ADMIN[0], "wrong"), ("nobody", ADMIN[1])):
        status, headers, body = Client(base, user).request("/")
        assert status == 401, (user, status)
        assert headers["WWW-Authenticate"].startswith('Basic realm="digest-cleanup console"')
        assert run["run_id"] not in body

    # With the admin's password the run is listed, with its status and its accounting
    status, _, page = Client(base, ADMIN).request("/")
    assert status == 200
    row = re.search(rf'<tr class="run" data-run-id="{run["run_id"]}">(.*?)</tr>', page, re.S)
    assert row, page
    assert '<td class="status">complete_with_failures</td>' in row.group(1)
    assert '<td class="accounting">ok</td>' in row.group(1)
    # and the run's page shows the denied keys with their code
    status, _, page = Client(base, ADMIN).request(f"/runs/{run['run_id']}")
    assert status == 200
    assert '<span id="status">complete_with_failures</span>' in page
    for key in DENIED:
        assert re.search(rf"{re.escape(key)}</td>\s*<td class=\"code\">AccessDenied<", page), key
    assert '<svg id="progress-chart"' in page
    assert "<polyline" in page
    # and no secret of the settings is on any page
    assert ADMIN[1] not in page
    assert "digest-cleanup-test-secret" not in page
    proc.stop()


def test_a_post_needs_the_xsrf_token_and_the_admin(denied_run, proxy):
    stack, run = denied_run
    _, base = _console(stack)
    entries = stack.cli("dlq", "list", "--json").json()["entries"]
    ids = [e["id"] for e in entries]
    assert len(ids) >= 1

    # Given the admin's confirmation page, which sets the XSRF cookie and carries the token
    admin = Client(base, ADMIN)
    status, _, confirm = admin.request("/dlq/redrive?" + urllib.parse.urlencode({"id": ids}, True))
    assert status == 200
    assert 'id="would-redrive"' in confirm
    # When a POST comes without the token, then it is refused and nothing moved
    status, _, _ = Client(base, ADMIN).request("/dlq/redrive", {"id": ids})
    assert status == 403
    assert len(stack.cli("dlq", "list", "--json").json()["entries"]) == len(ids)

    # A viewer sees the entries but no redrive or purge button
    viewer = Client(base, VIEWER)
    status, _, listing = viewer.request("/dlq")
    assert status == 200
    assert all(f'data-entry-id="{i}"' in listing for i in ids)
    assert 'id="redrive"' not in listing
    assert 'id="purge"' not in listing
    assert 'id="redrive"' in admin.request("/dlq")[2]
    # and the viewer's POST, with a valid cookie and token, is refused too
    _, _, viewer_confirm = viewer.request(
        "/dlq/redrive?" + urllib.parse.urlencode({"id": ids}, True)
    )
    status, _, _ = viewer.request("/dlq/redrive", {"id": ids, "_xsrf": _xsrf(viewer_confirm)})
    assert status == 403
    assert len(stack.cli("dlq", "list", "--json").json()["entries"]) == len(ids)

    # When the cause is fixed, the admin's confirmed POST redrives them through the CLI's code
    proxy.deny_keys = set()
    status, _, done = admin.request("/dlq/redrive", {"id": ids, "_xsrf": _xsrf(confirm)})
    assert status == 200, done
    assert 'id="redrive-result"' in done, done
    assert all(f'data-entry-id="{i}"' in done for i in ids)
    # Then the run completes and the queue is empty
    wait_for(
        lambda: stack.cli("status", run["run_id"], "--json").json()["status"] == "complete",
        60,
        "the redriven run to complete",
    )
    assert json.loads(stack.cli("dlq", "list", "--json").stdout)["entries"] == []


def test_a_confirmed_purge_drops_the_entries_and_audits_who_did_it(denied_run):
    stack, _run = denied_run
    _, base = _console(stack)
    ids = [e["id"] for e in stack.cli("dlq", "list", "--json").json()["entries"]]
    admin = Client(base, ADMIN)

    # Given the purge confirmation page, which names every entry and drops nothing yet
    status, _, confirm = admin.request("/dlq/purge?" + urllib.parse.urlencode({"id": ids}, True))
    assert status == 200
    assert 'id="confirm-purge"' in confirm
    assert all(i in confirm for i in ids)
    assert len(stack.cli("dlq", "list", "--json").json()["entries"]) == len(ids)

    # When the admin confirms it
    status, _, done = admin.request("/dlq/purge", {"id": ids, "_xsrf": _xsrf(confirm)})

    # Then the entries are gone, and the audit log holds the console's record of each,
    # naming the user, as the CLI's purge records its command
    assert status == 200, done
    assert 'id="purge-result"' in done, done
    assert stack.cli("dlq", "list", "--json").json()["entries"] == []
    runtime = Runtime(Settings(broker_url=stack.env["CLEANUP_BROKER_URL"]))
    records = runtime.dead_letters.audit_log()
    runtime.close()
    purged = {r["entry"]["id"]: r for r in records if r.get("action") == "purge"}
    assert set(ids) <= set(purged)
    assert all(purged[i]["command"].startswith(f"console: {ADMIN[0]} purged ") for i in ids)
