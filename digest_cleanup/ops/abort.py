"""Abort: end a stuck running run as failed, leaving the same audit record as a purge.

The CLI (``abort``) acts through :func:`abort_run`.  The run keeps what it
counted; batches still in flight are recorded as usual but cannot reopen it,
and its next trigger lists the target afresh.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from digest_cleanup.audit import reports
from digest_cleanup.clock import now_iso
from digest_cleanup.errors import RunStateError
from digest_cleanup.model.dead_letters import who
from digest_cleanup.pipeline.lifecycle import finish_run
from digest_cleanup.pipeline.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class AbortResult:
    """The audit record of an abort, where it was kept for good, and the run it ended."""

    record: dict[str, Any]
    #: The audit location's copy, or None when ``CLEANUP_AUDIT_URL`` is unset.
    audit_url: str | None
    #: The run as it stands after the abort (``failed``, reason ``aborted``).
    run: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return self.run | {"audit_record": self.record, "audit_url": self.audit_url}


def abort_run(runtime: Runtime, run_id: str, reason: str, command: str) -> AbortResult:
    """Fail the running run ``run_id`` on purpose, for ``reason``, asked for by ``command``.

    Raises :class:`~digest_cleanup.errors.RunStateError` when the run is not running:
    nothing is then changed or recorded.
    """
    store = runtime.store
    before = store.runs.get(run_id).as_dict()
    result = store.runs.abort(run_id, f"aborted by {who()}: {reason}")
    if result != "aborted":
        raise RunStateError(f"run {run_id} is {result}, not running: nothing to abort")
    at = now_iso()
    record = {
        "action": "abort",
        "at": at,
        "by": who(),
        "command": command,
        "reason": reason,
        "run": before,
    }
    # Redis keeps the audit record beside the purges'; the audit location keeps it for good.
    runtime.dead_letters.log_action(record)
    kept = reports.write_abort(runtime.settings, at, record)
    finish_run(runtime, run_id)
    return AbortResult(record, kept, store.runs.get(run_id).as_dict())
