"""The targets file and the run store read the one clock, under the names callers import."""

from __future__ import annotations

import re

from digest_cleanup import clock
from digest_cleanup.config import targets
from digest_cleanup.pipeline import runs


def test_the_old_import_paths_are_the_clock_itself() -> None:
    assert targets.utcnow is clock.utcnow
    assert runs.now_iso is clock.now_iso
    assert runs.epoch_of is clock.epoch_of


def test_stored_times_keep_their_form() -> None:
    # A run's times are ISO 8601 in UTC with milliseconds and a Z, as stored so far
    stamp = runs.now_iso()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    assert runs.epoch_of("2026-11-29T03:00:00.000Z") == 1_795_921_200.0
    assert runs.epoch_of("") is None
    assert runs.epoch_of("not a time") is None
    assert targets.utcnow().microsecond == 0
