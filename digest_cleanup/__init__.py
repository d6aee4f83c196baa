"""digest-cleanup: delete expired weekly-digest artifacts on a schedule, with an audit trail.

``celery -A digest_cleanup worker|beat|flower`` finds the app here.  It is
built on first access, so importing the package (the CLI does) never fails on
configuration; the Celery commands stop at start-up with a one-line reason.
"""

from __future__ import annotations

import sys
from typing import Any

__version__ = "0.1.0"


def default_app() -> Any:
    """The app for the environment's settings and targets, with its beat schedule."""
    from digest_cleanup.app import create_app
    from digest_cleanup.beat_schedule import build_schedule
    from digest_cleanup.errors import ConfigError
    from digest_cleanup.settings import Settings
    from digest_cleanup.targets import load_targets

    try:
        settings = Settings.from_env()
        targets = load_targets(settings.targets_file, audit_url=settings.audit_url)
    except ConfigError as exc:
        # SystemExit passes through Celery's app loader: one line, no traceback, and
        # status 2 as the CLI gives for the same mistake.
        print(f"digest-cleanup: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app = create_app(settings, targets)
    app.conf.beat_schedule = build_schedule(targets)
    return app


def __getattr__(name: str) -> Any:
    if name in ("app", "celery"):
        app = default_app()
        globals()["app"] = globals()["celery"] = app
        return app
    raise AttributeError(f"module 'digest_cleanup' has no attribute {name!r}")
