"""The console's pure parts: its users from the settings, basic auth, and the accounting check."""

from __future__ import annotations

import base64

import pytest

from digest_cleanup.console.auth import NOT_SET, Users, parse_basic
from digest_cleanup.console.views import accounting, chart, page_of
from digest_cleanup.errors import ConfigError, SettingsError
from digest_cleanup.model.run_view import RunView
from digest_cleanup.settings import Settings


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_users_come_from_the_settings_and_their_passwords_are_secrets():
    # Given an admin whose password holds a colon, and two viewers
    settings = Settings.from_env(
        {"CLEANUP_CONSOLE_AUTH": "ops:pa:ss", "CLEANUP_CONSOLE_VIEWERS": "ann:a1, bob:b2"}
    )
    # Then both are read, kept out of the repr, and masked as secrets
    assert settings.console_auth == ("ops", "pa:ss")
    assert settings.console_viewers == (("ann", "a1"), ("bob", "b2"))
    assert "pa:ss" not in repr(settings)
    assert {"pa:ss", "a1", "b2"} <= set(settings.secrets())


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CLEANUP_CONSOLE_AUTH", "ops"),
        ("CLEANUP_CONSOLE_AUTH", "ops:"),
        ("CLEANUP_CONSOLE_AUTH", ":pw"),
        ("CLEANUP_CONSOLE_VIEWERS", "ann:a1,bob"),
        ("CLEANUP_CONSOLE_VIEWERS", "ann:a1,ann:a2"),
        ("CLEANUP_CONSOLE_URL", "ops.example/console"),
    ],
)
def test_a_bad_console_setting_names_the_variable(name, value):
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"CLEANUP_CONSOLE_AUTH": "ops:pw", name: value})
    assert str(err.value).startswith(f"{name}: ")


def test_without_an_admin_there_are_no_users():
    with pytest.raises(ConfigError) as err:
        Users.from_settings(Settings.from_env({}))
    assert str(err.value) == NOT_SET


def test_basic_auth_tells_the_admin_a_viewer_and_everyone_else_apart():
    users = Users(("ops", "pw"), (("ann", "a1"),))
    admin, viewer = users.check(_basic("ops", "pw")), users.check(_basic("ann", "a1"))
    assert admin is not None
    assert admin.admin
    assert viewer is not None
    assert not viewer.admin
    for header in (
        None,
        "",
        _basic("ops", "wrong"),
        _basic("ann", "pw"),  # the admin's password is not every user's
        _basic("nobody", "pw"),
        "Bearer abc",
        "Basic not-base64!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
    ):
        assert users.check(header) is None, header
    assert parse_basic(_basic("a", "b:c")) == ("a", "b:c")


def _run(status: str, **counts: int) -> RunView:
    return RunView("r1", {"status": status, **{k: str(v) for k, v in counts.items()}})


def test_accounting_is_ok_only_when_a_finished_run_accounts_for_every_key():
    assert accounting(_run("complete", expired=10, deleted=7, dead_lettered=2, skipped=1)) == "ok"
    assert accounting(_run("failed", expired=10, deleted=7)) == "-3"
    assert accounting(_run("failed", expired=10, deleted=12)) == "+2"
    assert accounting(_run("running", expired=10, deleted=4)) == "6 to go"


def test_the_chart_starts_at_the_run_and_pages_hold_a_hundred_keys():
    drawn = chart([(110.0, 5, 5), (120.0, 10, 12)], started=100.0)
    assert drawn.top == 12
    assert len(drawn.deleted.split()) == 3
    assert chart([]).empty
    items, page, pages = page_of(list(range(250)), 9)
    assert (page, pages, items[0], len(items)) == (3, 3, 200, 50)


class _App:
    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    def send_task(self, name: str, **options: object) -> None:
        self.sent.append(options)


@pytest.mark.parametrize("url", [None, "https://ops.example/cleanup/"])
def test_a_dead_letters_flower_label_links_to_its_console_page_when_the_url_is_set(url):
    from digest_cleanup.model.dead_letters import DeadLetter
    from digest_cleanup.pipeline.runtime import Runtime
    from digest_cleanup.tasks.dispatch import CeleryDispatcher

    env = {"CLEANUP_CONSOLE_URL": url} if url else {}
    app = _App()
    dispatcher = CeleryDispatcher(app, Runtime(Settings.from_env(env)))
    dispatcher.send_dead_letter(DeadLetter("e/1", {}, "statements 2 keys"))
    label = app.sent[0]["argsrepr"]
    assert str(label).startswith("dead letter: statements ")
    link = " console: https://ops.example/cleanup/dlq/e%2F1"
    assert str(label).endswith(link) if url else "console" not in str(label)


def test_the_console_masks_secrets_in_every_form_the_logs_do():
    from digest_cleanup.console.app import Console
    from digest_cleanup.pipeline.runtime import Runtime

    settings = Settings.from_env(
        {"AWS_SECRET_ACCESS_KEY": "s3cr/t+key", "CLEANUP_CONSOLE_AUTH": "ops:pw-of-ops"}
    )
    console = Console(Runtime(settings), Users.from_settings(settings))
    shown = console.mask("signing with s3cr/t+key, quoted s3cr%2Ft%2Bkey, login pw-of-ops")
    assert "s3cr" not in shown
    assert "pw-of-ops" not in shown
    assert shown.count("***") == 3
