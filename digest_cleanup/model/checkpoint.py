"""Where a sweep is: its checkpoint, one part per phase, stored as JSON after every step.

A sweep has two phases.  The *guard* pass counts the expired keys before
anything is deleted (and refuses a run past ``max_delete``); the *publish*
phase sends their batches.  In between sits the *stage*: the expired keys cut
into batches in Redis, which the guard pass fills as it counts (up to
:data:`~digest_cleanup.pipeline.sweep_phases.STAGE_LIMIT` keys) and the publish phase
drains.  A run too big to stage whole is staged again by the publish phase, a
window at a time, from a second listing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

#: An expired key with its delete condition (``[key, condition]``), as staged.
Expired = list[str]


@dataclasses.dataclass
class GuardPass:
    """The guard pass's own counts; the run's counters stay at zero until publishing."""

    cursor: str | None = None
    listed: int = 0
    expired: int = 0
    #: A dry run's sample of the keys it would delete.
    sample: list[str] = dataclasses.field(default_factory=list)
    #: Whether the guard pass is staging what it counts; False once it passed
    #: ``STAGE_LIMIT`` keys and dropped the stage.
    staging: bool = True


@dataclasses.dataclass
class Stage:
    """The batches in Redis, and the listing that fills them."""

    #: Where the listing that fills the stage has got to (the guard's own while it stages).
    cursor: str | None = None
    #: Expired keys listed but not yet in a staged batch.
    unbatched: list[Expired] = dataclasses.field(default_factory=list)
    #: Batches in the stage now; stage index ``i`` is batch ``base + i + 1``.
    staged: int = 0
    base: int = 0
    #: True once every expired key is staged or sent: no more listing to do.
    complete: bool = False


@dataclasses.dataclass
class Publishing:
    """What the publish phase has sent, and the run counters it owns."""

    #: Batches counted in flight (the run's ``batches``); ``sent`` catches up after
    #: they are sent, so a slice that died in between sends ``sent + 1 .. seq`` again.
    seq: int = 0
    sent: int = 0
    listed: int = 0
    expired: int = 0
    done: bool = False


@dataclasses.dataclass
class Checkpoint:
    """A sweep's whole state between slices."""

    phase: Literal["guard", "publish"] = "guard"
    #: The run incarnation's token, stamped on every batch (see ``RunRecords.open``).
    run_token: str = ""
    guard: GuardPass = dataclasses.field(default_factory=GuardPass)
    stage: Stage = dataclasses.field(default_factory=Stage)
    publishing: Publishing = dataclasses.field(default_factory=Publishing)

    def to_stored(self) -> dict[str, Any]:
        """As stored; the run store copies ``listed``, ``expired``, ``seq`` and ``done``
        into the run's counters in the same step (see ``Sweeps.save_checkpoint``)."""
        pub = self.publishing
        return dataclasses.asdict(self) | {
            "listed": pub.listed,
            "expired": pub.expired,
            "seq": pub.seq,
            "done": pub.done,
        }

    @classmethod
    def from_stored(cls, raw: dict[str, Any] | None, run_token: str) -> Checkpoint:
        if raw is None:
            return cls(run_token=run_token)
        return cls(
            phase=raw["phase"],
            run_token=raw["run_token"],
            guard=GuardPass(**raw["guard"]),
            stage=Stage(**raw["stage"]),
            publishing=Publishing(**raw["publishing"]),
        )
