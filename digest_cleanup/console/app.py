"""The console's Tornado application: one handler a page, auth and CSRF on every one.

The handlers are synchronous: each page is a few Redis reads, and one operator
console serves a handful of people, so an event loop blocked for a millisecond
costs nothing and the code stays the CLI's.  Every request passes basic auth
(a 401 otherwise, before anything else is read); every POST carries Tornado's
XSRF token, and only the admin may POST (a viewer's POST is a 403).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import tornado.web
from tornado.template import DictLoader

from digest_cleanup.clock import epoch_of
from digest_cleanup.console import pages, views
from digest_cleanup.console.auth import CHALLENGE, User, Users
from digest_cleanup.errors import CleanupError, DeadLetterError, RunStateError
from digest_cleanup.logs import Scrubber
from digest_cleanup.model.dead_letters import ENTRY_FIELDS, Entry
from digest_cleanup.model.run_view import COUNTERS
from digest_cleanup.ops.purge import purge_entries
from digest_cleanup.ops.redrive import redrive_entries
from digest_cleanup.pipeline.runtime import Runtime

#: Runs the runs page lists, newest first.
RUNS_SHOWN = 50
#: Headers on every answer: nothing cached, framed, or sent on as a referrer; no script runs.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
}
#: The entry fields an entry's page lists: ``dlq show``'s, and how many copies arrived.
SHOWN_FIELDS = (*ENTRY_FIELDS, "copies")


@dataclasses.dataclass(frozen=True)
class Console:
    """What every handler shares: the runtime (Redis, targets) and the users."""

    runtime: Runtime
    users: Users

    @functools.cached_property
    def _scrubber(self) -> Scrubber:
        # No key prefixes: the console shows keys as `dlq show` does, and masks secrets only.
        return Scrubber(self.runtime.settings)

    def mask(self, text: Any) -> str:
        """``text`` with every secret masked, in every form the logs mask it."""
        return self._scrubber(str(text))

    def entry_view(self, entry: Entry) -> dict[str, Any]:
        """An entry as ``dlq show --json`` gives it, with its distinct codes and secrets masked."""
        data = entry.as_dict()
        data["message"] = self.mask(data["message"])
        for key in data["keys"]:
            key["message"] = self.mask(key["message"])
        data["codes"] = sorted({k["code"] for k in data["keys"]} - {""}) or [data["reason"]]
        return data


class Base(tornado.web.RequestHandler):
    """Auth, headers and error pages for every page."""

    console: Console

    def initialize(self, console: Console) -> None:
        self.console = console

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    def get_current_user(self) -> User | None:
        return self.console.users.check(self.request.headers.get("Authorization"))

    def check_xsrf_cookie(self) -> None:
        # Tornado checks the token before prepare(); without credentials the answer is
        # the 401 prepare() gives, and the token is checked for everyone who has them.
        if self.current_user is not None:
            super().check_xsrf_cookie()

    def prepare(self) -> None:
        if self.current_user is None:
            self.set_status(401)
            self.set_header("WWW-Authenticate", CHALLENGE)
            self.finish("401 Unauthorized: this console needs a user and password\n")
        elif self.request.method == "POST" and not self.current_user.admin:
            raise tornado.web.HTTPError(403, "read-only user %s may not change anything",
                                        self.current_user.name)  # fmt: skip

    def get_template_namespace(self) -> dict[str, Any]:
        return super().get_template_namespace() | {"refresh": False}

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = ""
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif isinstance(exc, CleanupError):
            message = str(exc)
        if self.current_user is None:
            self.finish(f"{status_code} {self._reason}\n")
            return
        self.render("error.html", status=status_code, reason=self._reason, message=message)

    def not_found(self, exc: CleanupError) -> tornado.web.HTTPError:
        return tornado.web.HTTPError(404, "%s", self.console.mask(exc))

    def selected(self) -> list[Entry]:
        """The entries named by ``id`` arguments (query or form), all of which must exist."""
        ids = list(dict.fromkeys(self.get_arguments("id")))
        if not ids:
            raise tornado.web.HTTPError(400, "select at least one entry on the dead-letter page")
        try:
            return self.console.runtime.dead_letters.select(ids=ids)
        except DeadLetterError as exc:
            raise self.not_found(exc) from None


class RunsPage(Base):
    def get(self) -> None:
        store = self.console.runtime.store
        target = self.get_argument("target", "") or None
        rows = []
        for run_id in store.runs.run_ids(limit=RUNS_SHOWN * 5):
            run = store.runs.find(run_id)
            if run is None or (target and run.fields.get("target") != target):
                continue
            rows.append(views.run_row(run, store.runs.progress(run_id), self._budget(run.fields)))
            if len(rows) >= RUNS_SHOWN:
                break
        self.render("runs.html", rows=rows, refresh=any(r["running"] for r in rows))

    def _budget(self, fields: Any) -> Any:
        return self.console.runtime.budget_state(fields.get("target", ""))


class RunPage(Base):
    def get(self, run_id: str) -> None:
        runtime = self.console.runtime
        try:
            run = runtime.store.runs.get(run_id)
        except RunStateError as exc:
            raise self.not_found(exc) from None
        samples = runtime.store.runs.progress(run_id)
        row = views.run_row(run, samples, runtime.budget_state(run.fields.get("target", "")))
        entries = [self.console.entry_view(e) for e in runtime.dead_letters.entries(run=run_id)]
        keys = [
            {"key": k["key"], "code": k.get("code", ""), "message": self.console.mask(
                k.get("message", "")), "where": "skipped"}
            for k in runtime.store.runs.skipped_keys(run_id)
        ]  # fmt: skip
        keys += [k | {"where": e["id"]} for e in entries for k in e["keys"]]
        shown, page, pages = views.page_of(keys, self._page())
        counters = [(name, run.fields.get(name, "0")) for name in (*COUNTERS, "expired_seen")]
        self.render(
            "run.html",
            run=run,
            row=row,
            counters=counters,
            chart=views.chart(samples, epoch_of(run.fields.get("created_at"))),
            width=views.CHART_WIDTH,
            height=views.CHART_HEIGHT,
            keys=shown,
            page=page,
            pages=pages,
            entries=entries,
            refresh=not run.finished,
        )

    def _page(self) -> int:
        try:
            return int(self.get_argument("page", "1"))
        except ValueError:
            return 1


class DeadLettersPage(Base):
    def get(self) -> None:
        dlq = self.console.runtime.dead_letters
        filters = {name: self.get_argument(name, "").strip() for name in ("run", "target", "error")}
        entries = dlq.select(
            run=filters["run"] or None,
            target=filters["target"] or None,
            error=filters["error"] or None,
            everything=True,
        )
        actions = [
            ("redrive-form", "/dlq/redrive", "redrive", "Redrive"),
            ("purge-form", "/dlq/purge", "purge", "Purge"),
        ]
        self.render(
            "dlq.html",
            depth=dlq.depth(),
            entries=[self.console.entry_view(e) for e in entries],
            filters=filters,
            actions=actions,
        )


class EntryPage(Base):
    def get(self, entry_id: str) -> None:
        try:
            entry = self.console.runtime.dead_letters.get(entry_id)
        except DeadLetterError as exc:
            raise self.not_found(exc) from None
        self.render("entry.html", entry=self.console.entry_view(entry), fields=SHOWN_FIELDS)


class RedrivePage(Base):
    def get(self) -> None:
        """Confirmation: the dry run of the same redrive, what would move and what not."""
        entries = self.selected()
        result = redrive_entries(self.console.runtime, entries, dry_run=True)
        self.render("confirm.html", action="redrive", verb="Redrive", title="Redrive?",
                    entries=entries, result=self._masked(result))  # fmt: skip

    def post(self) -> None:
        entries = self.selected()
        result = redrive_entries(self.console.runtime, entries, dry_run=False)
        runs = sorted({e.run_id for e in entries if e.run_id})
        self.render("redrive_result.html", result=self._masked(result), runs=runs)

    def _masked(self, result: Any) -> Any:
        refused = [
            dataclasses.replace(r, message=self.console.mask(r.message)) for r in result.refused
        ]
        return dataclasses.replace(result, refused=refused)


class PurgePage(Base):
    def get(self) -> None:
        entries = self.selected()
        self.render("confirm.html", action="purge", verb="Purge", title="Purge for good?",
                    entries=entries, result=None)  # fmt: skip

    def post(self) -> None:
        entries = self.selected()
        user = self.current_user.name if self.current_user else "?"
        ids = ", ".join(e.id for e in entries)
        result = purge_entries(self.console.runtime, entries, f"console: {user} purged {ids}")
        where = self.console.runtime.dead_letters.audit_key
        where += f" and {result.audit_url}" if result.audit_url else ""
        self.render("purge_result.html", result=result, where=where)


def make_app(runtime: Runtime, users: Users, **settings: Any) -> tornado.web.Application:
    """The console for ``runtime``'s run store and dead-letter queue."""
    console = {"console": Console(runtime, users)}
    return tornado.web.Application(
        [
            (r"/", RunsPage, console),
            (r"/runs/([^/]+)", RunPage, console),
            (r"/dlq", DeadLettersPage, console),
            (r"/dlq/redrive", RedrivePage, console),
            (r"/dlq/purge", PurgePage, console),
            (r"/dlq/([^/]+)", EntryPage, console),
        ],
        template_loader=DictLoader(pages.TEMPLATES),
        xsrf_cookies=True,
        # The token cookie is for this console's forms only.
        xsrf_cookie_kwargs={"httponly": True, "samesite": "Strict"},
        **settings,
    )
