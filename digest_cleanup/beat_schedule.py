"""The beat schedule, generated from the targets file: one entry per target.

Each entry sends ``digest_cleanup.trigger`` on the target's crontab (UTC).
When beat starts it also sends one catch-up trigger per target; the trigger
locks the slot in Redis, so this never doubles a run, and a slot missed
while beat was down runs once.
"""

from __future__ import annotations

from typing import Any

from celery import signals

from digest_cleanup.pipeline.messaging import SWEEP_QUEUE
from digest_cleanup.targets import Targets
from digest_cleanup.tasks.dispatch import TRIGGER_TASK

#: A trigger still queued this long after its slot is stale; the next beat
#: start or slot covers it, so it is dropped rather than run late.
TRIGGER_EXPIRES_SECONDS = 6 * 3600


def build_schedule(targets: Targets) -> dict[str, dict[str, Any]]:
    """``beat_schedule`` for these targets."""
    return {
        f"cleanup-{t.name}": {
            "task": TRIGGER_TASK,
            "schedule": t.crontab(),
            "args": [t.name],
            "options": {"queue": SWEEP_QUEUE, "expires": TRIGGER_EXPIRES_SECONDS},
        }
        for t in targets
    }


@signals.beat_init.connect
def catch_up(sender: Any = None, **_: Any) -> None:
    """On beat start, ask every target's trigger to run a missed slot (claimed once)."""
    app = sender.app
    for entry in app.conf.beat_schedule.values():
        if entry.get("task") == TRIGGER_TASK:
            app.send_task(
                TRIGGER_TASK,
                args=entry["args"],
                kwargs={"catch_up": True},
                queue=SWEEP_QUEUE,
                expires=TRIGGER_EXPIRES_SECONDS,
            )
