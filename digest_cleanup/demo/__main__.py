"""``python -m digest_cleanup.demo``: the demo's command line (see the package docstring)."""

from __future__ import annotations

from digest_cleanup.demo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
