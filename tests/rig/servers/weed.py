"""The suite's ``weed mini``: the demo's server, started or the test skipped (failed under CI)."""

from __future__ import annotations

import os

from digest_cleanup.demo.servers import WeedServer, find_weed
from tests.rig.tools import INSTALL, require, started_or_skip


def required_weed(data_dir: str | os.PathLike[str]) -> WeedServer:
    """A started ``weed mini`` for a test session, or the test skipped (failed under CI)."""
    install = INSTALL["weed"]
    require(find_weed() is not None, "no weed binary", install=install)
    return started_or_skip(WeedServer(data_dir=data_dir), "weed mini", install=install)
