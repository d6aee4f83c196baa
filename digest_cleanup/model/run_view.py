"""The record of one run, a Redis hash: its fields, its statuses, and the rule that ends it.

A run is ``running`` until the step that leaves the sweep done and nothing in
flight settles its final status (``finish`` in the store's ``finish.lua``);
:class:`RunView` is a read-only snapshot of the hash.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal

#: Counters every run carries, all starting at 0.
COUNTERS = (
    "listed",
    "expired",
    "batches",
    "batches_done",
    "deleted",
    "dead_lettered",
    "skipped",
    "retries",
    "redriven",
    "duplicates",
    "inflight",
)
#: Plain fields that hold a yes or no.
BOOL_FIELDS = frozenset(
    {"dry_run", "sweep_done", "forced", "conditional_deletes", "report_pending"}
)
#: Plain fields that hold whole numbers.
INT_FIELDS = frozenset({"batch_size", "max_delete", "expired_seen", "sweep_errors"})
#: Plain fields that hold a number with a fraction.
FLOAT_FIELDS = frozenset({"max_skipped_share"})
#: The reason a run that skipped more than its target's ``max_skipped_share`` ends
#: ``complete_with_failures``: every skip is a key kept, so many are worth a look.
SKIPPED_SHARE_EXCEEDED = "max_skipped_share_exceeded"
#: Statuses a run can be in; the last three are final until a redrive reopens it.
Status = Literal["running", "complete", "complete_with_failures", "failed"]
FINAL_STATUSES = frozenset({"complete", "complete_with_failures", "failed"})


@dataclasses.dataclass(frozen=True)
class RunView:
    """A read-only snapshot of one run."""

    run_id: str
    fields: Mapping[str, str]

    def __getitem__(self, name: str) -> str:
        return self.fields[name]

    @property
    def status(self) -> str:
        return self.fields.get("status", "unknown")

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def count(self, name: str) -> int:
        return int(self.fields.get(name, 0) or 0)

    def as_dict(self) -> dict[str, Any]:
        """The run as JSON-able data: counters as ints, empty fields dropped."""
        out: dict[str, Any] = {"run_id": self.run_id}
        for key, value in sorted(self.fields.items()):
            if key in COUNTERS or key in INT_FIELDS:
                out[key] = int(value or 0)
            elif key in FLOAT_FIELDS:
                out[key] = float(value)
            elif key in (
                "dry_run",
                "sweep_done",
                "forced",
                "conditional_deletes",
                "report_pending",
            ):
                out[key] = value == "1"
            elif key == "sample":
                out[key] = json.loads(value)
            elif value != "":
                out[key] = value
        for key in COUNTERS:
            out.setdefault(key, 0)
        return out
