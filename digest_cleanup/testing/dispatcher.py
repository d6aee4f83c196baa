"""A :class:`~digest_cleanup.pipeline.messaging.Dispatcher` that keeps what is sent.

For tests of the pipeline without a broker::

    runtime = Runtime(settings, dispatcher=RecordingDispatcher())
    sweep_slice(runtime, run_id)
    assert runtime.dispatcher.batches

``on_batch`` is called with every batch before it is kept: a test makes sending
fail by raising from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from digest_cleanup.model.batches import BatchPayload
from digest_cleanup.model.dead_letters import DeadLetter
from digest_cleanup.pipeline.runtime import Runtime


@dataclasses.dataclass
class Sent:
    """A batch as sent, with its countdown and task id."""

    payload: BatchPayload
    countdown: float | None
    task_id: str | None


class RecordingDispatcher:
    """Keeps every batch, sweep slice and dead letter, in the order sent."""

    def __init__(self, on_batch: Callable[[BatchPayload], object] | None = None) -> None:
        self.on_batch = on_batch
        self.sent: list[Sent] = []
        self.sweeps: list[tuple[str, float | None]] = []
        self.dead: dict[str, DeadLetter] = {}

    @property
    def batches(self) -> list[BatchPayload]:
        return [s.payload for s in self.sent]

    def send_batch(
        self, payload: BatchPayload, *, countdown: float | None = None, task_id: str | None = None
    ) -> None:
        if self.on_batch is not None:
            self.on_batch(payload)
        self.sent.append(Sent(payload, countdown, task_id))

    def send_sweep(self, run_id: str, *, countdown: float | None = None) -> None:
        self.sweeps.append((run_id, countdown))

    def send_dead_letter(self, letter: DeadLetter) -> None:
        self.dead[letter.entry_id] = letter


def recording(
    runtime: Runtime, on_batch: Callable[[BatchPayload], object] | None = None
) -> Runtime:
    """``runtime``, now sending to a new :class:`RecordingDispatcher`; for one-line test calls."""
    runtime.dispatcher = RecordingDispatcher(on_batch)
    return runtime
