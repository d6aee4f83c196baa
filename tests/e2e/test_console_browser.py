"""The console in headless Chromium, on the real stack: dead letters seen and redriven.

One run, in which S3 refuses two keys in two batches, is followed through the console
the way someone on call would: the runs table, the run's page, the dead-letter page,
a redrive confirmed by a click, and the run page reading ``complete`` afterwards.  The
same stack answers the requests a browser would not make: no credentials, a POST with
no CSRF token, and a read-only viewer's POST.  With ``DC_UPDATE_SCREENSHOT=1``
(``make screenshot``) it saves the README's console screenshots.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, list_keys, s3_targets, seed_split
from tests.rig.servers import free_port
from tests.rig.stack import Process, Stack, wait_for
from tests.rig.webdriver import Session, basic_auth, chromium

pytestmark = pytest.mark.e2e

KEYS = [f"statements/2026-10-18/cust-{i:06d}.pdf" for i in range(600)]
#: Batches of 200: one refused key in the first batch and one in the last, two entries.
DENIED = {KEYS[17], KEYS[555]}
ADMIN = "ops:console-e2e-password"
VIEWER = "viewer:console-e2e-viewer"
IMAGES = REPO_ROOT / "docs" / "img"

#: Requests go straight to the loopback, never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(
    url: str, *, auth: str | None = None, form: dict[str, str] | None = None, cookie: str = ""
) -> tuple[int, str, Any]:
    """One plain urllib request (a POST when ``form`` is given): status, body and headers."""
    headers = {"Authorization": basic_auth(auth)} if auth else {}
    if cookie:
        headers["Cookie"] = cookie
    data = None if form is None else urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 (loopback)
    try:
        with _OPENER.open(request, timeout=30) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace"), error.headers


def _start_console(stack: Stack) -> str:
    """Start ``digest-cleanup console`` on a free port; return its URL once it answers."""
    port = free_port()
    argv = [stack.executable("digest-cleanup"), "console", "--port", str(port)]
    env = {"CLEANUP_CONSOLE_AUTH": ADMIN, "CLEANUP_CONSOLE_VIEWERS": VIEWER}
    console = stack.start("console", argv, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(console, url), 60, "the console to answer")
    return url


def _answers(console: Process, url: str) -> bool:
    if not console.alive():
        raise AssertionError(f"the console exited:\n{console.output()[-3000:]}")
    try:
        return _request(url + "/", auth=ADMIN)[0] == 200
    except OSError:
        return False


def _entries(stack: Stack) -> list[dict[str, Any]]:
    result = stack.cli("dlq", "list", "--json")
    assert result.code == 0, result
    return list(result.json()["entries"])


def _screenshot(session: Session, name: str, tmp_path: Path) -> None:
    """Save the page as ``docs/img/NAME`` on request (``make screenshot``), else in tmp.

    A test run leaves the work tree as it found it; the PNG is checked either way.
    """
    png = session.full_screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 10_000, f"{name} looks blank ({len(png)} bytes)"
    target = IMAGES / name if os.environ.get("DC_UPDATE_SCREENSHOT") == "1" else tmp_path / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(png)


def test_console_lists_dead_letters_and_redrives_them_after_a_confirmed_click(
    make_stack, s3, bucket, proxy, tmp_path
):
    # Given a run (under a delete budget) in which S3 refused two keys, in two batches
    cutoff = seed_split(s3, bucket, KEYS, [])
    proxy.deny_keys = set(DENIED)
    stack = make_stack(s3_targets(bucket, batch_size=200, delete_rate=3500))
    stack.worker()
    run = stack.cli("run", "statements", "--cutoff", cutoff.isoformat(), "--wait", "--json").json()
    assert run["status"] == "complete_with_failures", run
    run_id = run["run_id"]
    entry_ids = sorted(e["id"] for e in _entries(stack))
    assert len(entry_ids) == 2
    # and the console started the way the deployment files start it
    url = _start_console(stack)

    # Nothing is shown without the credentials, or with wrong ones
    for path in ("/", f"/runs/{run_id}", "/dlq", f"/dlq/redrive?id={entry_ids[0]}"):
        assert _request(url + path)[0] == 401, path
    assert _request(url + "/", auth="ops:wrong")[0] == 401

    with chromium(tmp_path / "browser", stack=stack, window=(1600, 480)) as browser:
        # When ops open the console
        browser.authenticate(ADMIN)
        browser.open(url + "/")

        # Then the run is in the runs table, with dead letters
        runs = dict(
            zip(
                browser.attributes("#runs tr.run", "data-run-id"),
                browser.texts("#runs tr.run td.status"),
                strict=True,
            )
        )
        assert runs[run_id] == "complete_with_failures", runs
        _screenshot(browser, "console-runs.png", tmp_path)

        # and its page (one click away) has the counters, the chart, and each refused key
        browser.click(f'#runs tr.run[data-run-id="{run_id}"] a.run-link')
        browser.wait_for_element("#status")
        assert browser.url == f"{url}/runs/{run_id}"
        assert browser.text("#status") == "complete_with_failures"
        browser.find("#counters")
        browser.find("#progress-chart")
        not_deleted = browser.texts("#not-deleted tr.key")
        assert len(not_deleted) == 2, not_deleted
        assert browser.texts("#not-deleted tr.key td.code") == ["AccessDenied", "AccessDenied"]
        assert all(any(key in row for row in not_deleted) for key in DENIED), not_deleted
        dead_letters = browser.text("#dead-letters")
        assert all(entry_id in dead_letters for entry_id in entry_ids), dead_letters
        _screenshot(browser, "console-run.png", tmp_path)

        # The dead-letter page lists both entries with their codes, and filters
        browser.open(f"{url}/dlq?run={run_id}")
        assert sorted(browser.attributes("#entries tr.entry", "data-entry-id")) == entry_ids
        codes = browser.texts("#entries tr.entry td.codes")
        assert len(codes) == 2
        assert all("AccessDenied" in c for c in codes), codes
        browser.find("#purge")
        _screenshot(browser, "console-dlq.png", tmp_path)
        browser.open(f"{url}/dlq?run={run_id}&error=SlowDown")
        assert browser.find_all("#entries tr.entry") == []
        browser.open(f"{url}/dlq?target=statements&error=AccessDenied")
        assert sorted(browser.attributes("#entries tr.entry", "data-entry-id")) == entry_ids

        # A read-only viewer sees the entries but neither button
        browser.authenticate(VIEWER)
        browser.open(f"{url}/dlq?run={run_id}")
        assert sorted(browser.attributes("#entries tr.entry", "data-entry-id")) == entry_ids
        assert browser.find_all("#redrive") == []
        assert browser.find_all("#purge") == []
        assert browser.find_all("#redrive-form, #purge-form") == []

        # When ops, the cause fixed, click Redrive
        proxy.deny_keys = set()
        browser.authenticate(ADMIN)
        browser.open(f"{url}/dlq?run={run_id}")
        browser.click("#redrive")

        # Then a confirmation lists what will move, and nothing has moved yet
        browser.wait_for_element("#confirm-redrive")
        would = " ".join(browser.texts("#would-redrive li"))
        assert all(entry_id in would for entry_id in entry_ids), would
        assert browser.texts("#would-refuse li") == []
        _screenshot(browser, "console-redrive-confirm.png", tmp_path)
        assert sorted(e["id"] for e in _entries(stack)) == entry_ids
        action = str(browser.script("return document.getElementById('confirm-redrive').action;"))
        fields: dict[str, str] = dict(
            browser.script(
                "return Array.from(new FormData(document.getElementById('confirm-redrive')))"
                ".map(function (pair) { return [pair[0], String(pair[1])]; });"
            )
        )
        xsrf = browser.cookie("_xsrf")
        assert fields.get("_xsrf"), fields

        # and the form's POST is refused without its CSRF token, even with the credentials
        unprotected = {k: v for k, v in fields.items() if k != "_xsrf"}
        assert _request(action, auth=ADMIN, form=unprotected)[0] == 403
        # and refused to a viewer, even with a valid token pair (cookie and field)
        token = {**unprotected, "_xsrf": xsrf}
        assert _request(action, auth=VIEWER, form=token, cookie=f"_xsrf={xsrf}")[0] == 403
        assert sorted(e["id"] for e in _entries(stack)) == entry_ids

        # When ops confirm
        browser.click("#confirm")

        # Then the result lists both entries as redriven, none refused
        browser.wait_for_element("#redrive-result")
        redriven = " ".join(browser.texts("#redriven li"))
        assert all(entry_id in redriven for entry_id in entry_ids), redriven
        assert browser.texts("#refused li") == []

        # and the run's page reads complete once the workers have deleted the keys
        def run_page_status() -> str | None:
            browser.open(f"{url}/runs/{run_id}")
            status = browser.text("#status")
            return status if status == "complete" else None

        assert wait_for(run_page_status, 60, "the run page to read complete", interval=0.5)
        assert browser.texts("#not-deleted tr.key") == []

    # The console's redrive is the CLI's: the queue is empty, the run counts it, S3 is clean
    status = stack.cli("status", run_id, "--json").json()
    assert status["status"] == "complete"
    assert status["redriven"] == 2
    assert status["dead_lettered"] == 0
    assert status["deleted"] == len(KEYS)
    assert _entries(stack) == []
    assert list_keys(s3, bucket) == set()
