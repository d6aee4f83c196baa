"""The clock module is the one place that turns the wall clock into datetimes and stored times."""

from __future__ import annotations

import re
from pathlib import Path

import digest_cleanup

PACKAGE = Path(digest_cleanup.__file__).parent
#: Modules that read ``datetime.now`` themselves, and why.
OWN_CLOCK = {
    "clock.py": "the clock itself",
    # Object Lock's retain-until is compared to the microsecond; clock.utcnow rounds.
    "kinds/s3_delete.py": "sub-second comparison",
    # The demo seeds objects around a cutoff it waits for, to the millisecond.
    "demo/artifacts.py": "sub-second waits",
}
#: A function that would be another copy of one of the clock's.
HELPER = r"^def _?(utcnow|now_iso|iso_now|epoch_of|now)\("


def test_only_the_clock_reads_wall_clock_datetimes():
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"datetime\.now\(|datetime\.utcnow\(", path.read_text())
    }
    assert readers == set(OWN_CLOCK)


def test_no_module_keeps_a_private_copy_of_a_clock_helper():
    copies = [
        f"{path.relative_to(PACKAGE)}: {m.group(0)}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "clock.py"
        for m in re.finditer(
            r"^def _?(utcnow|now_iso|iso_now|epoch_of|now)\(", path.read_text(), re.M
        )
    ]
    assert copies == []
