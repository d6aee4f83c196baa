"""Who may use the console: HTTP basic auth against the configured admin and viewers.

The admin (``CLEANUP_CONSOLE_AUTH``) may redrive and purge; viewers
(``CLEANUP_CONSOLE_VIEWERS``) only look.  Passwords are compared with
:func:`hmac.compare_digest`, against every user, so the time an answer takes
says nothing about which part was wrong.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
from typing import Literal

from digest_cleanup.errors import ConfigError
from digest_cleanup.settings import Settings

Role = Literal["admin", "viewer"]
#: The realm a browser shows in its password prompt.
REALM = "digest-cleanup console"
#: What ``WWW-Authenticate`` says on a 401.
CHALLENGE = f'Basic realm="{REALM}", charset="UTF-8"'
#: The one line a console started without an admin prints (exit 2).
NOT_SET = (
    "CLEANUP_CONSOLE_AUTH is not set; the console never runs open: "
    "set CLEANUP_CONSOLE_AUTH=user:password (and optionally "
    "CLEANUP_CONSOLE_VIEWERS=user:pw,... for read-only users)"
)


@dataclasses.dataclass(frozen=True)
class User:
    """Someone who passed basic auth."""

    name: str
    role: Role

    @property
    def admin(self) -> bool:
        return self.role == "admin"


@dataclasses.dataclass(frozen=True)
class Users:
    """The console's users and their passwords, from the settings."""

    admin: tuple[str, str]
    viewers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Users:
        """The users, or :class:`ConfigError` when no admin is set (the console never runs open)."""
        if settings.console_auth is None:
            raise ConfigError(NOT_SET)
        return cls(settings.console_auth, settings.console_viewers)

    def check(self, header: str | None) -> User | None:
        """The user an ``Authorization`` header proves, or None."""
        given = parse_basic(header)
        if given is None:
            return None
        found: User | None = None
        entries = [(self.admin, "admin"), *((v, "viewer") for v in self.viewers)]
        for (name, password), role in entries:
            # Every entry is compared, so no early answer hints at which user exists.
            same_name = hmac.compare_digest(given[0].encode(), name.encode())
            same_password = hmac.compare_digest(given[1].encode(), password.encode())
            if same_name and same_password and found is None:
                found = User(name, role)  # type: ignore[arg-type]  # the two roles above
        return found


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` from ``Basic base64(user:password)``, or None if it is not one."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None
