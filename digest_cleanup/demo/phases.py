"""The demo's console: the one way it prints, and the wall-clock time of each phase."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


def say(text: str = "") -> None:
    """Print a line at once, so that it shows before a slow phase that follows it."""
    print(text, flush=True)


class Phases:
    """Wall-clock time of each named phase, printed as the demo goes and summed at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Announce the phase ``name``, and say how long it took once it ends."""
        say(f"==> {name}")
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - started
            say(f"    {name}: {self.seconds[name]:.1f} s")

    def summary(self) -> str:
        """Every phase with its time, then the total, on one line."""
        parts = [f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items()]
        return ", ".join(parts) + f"; total {sum(self.seconds.values()):.1f} s"
