"""``digest-cleanup metrics``: the stateless Prometheus endpoint (the ``metrics`` extra)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import add_command, print_json
from digest_cleanup.errors import CleanupError, UsageError

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands

#: The port the deployment files and the alert rules' scrape config expect.
DEFAULT_PORT = 9808
#: Loopback by default: exposing run state beyond the host is the operator's choice.
DEFAULT_ADDRESS = "127.0.0.1"


def register(subcommands: Subcommands) -> None:
    """Add ``metrics``."""
    p = add_command(
        subcommands, "metrics", metrics_command, "serve Prometheus metrics read from the run store"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    p.add_argument(
        "--address", default=DEFAULT_ADDRESS, help="address to listen on; default %(default)s"
    )


def metrics_command(args: argparse.Namespace, ctx: Context) -> int:
    """Serve ``/metrics`` until stopped, or with ``--json`` print one snapshot and exit."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise UsageError(
            "digest-cleanup metrics needs prometheus-client: pip install 'digest-cleanup[metrics]'"
        ) from None
    from digest_cleanup.ops.metrics import RunStateCollector, snapshot

    targets = ctx.runtime.targets  # a bad targets file fails now, not at the first scrape
    collector = RunStateCollector(ctx.runtime)
    if args.json:
        ctx.ping()  # one snapshot of an unreachable store is an error, not "redis_up 0"
        print_json(snapshot(collector.collect()))
        return 0
    # No Redis check here: a server started before Redis answers with redis_up 0
    # (and the alert on absent series) instead of exiting and restarting in a loop.
    _log_to_stderr(ctx)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(args.port, addr=args.address, registry=registry)
    except OSError as exc:
        raise CleanupError(
            f"cannot listen on {args.address}:{args.port}: {exc.strerror or exc}; "
            "choose another --port or stop what holds it"
        ) from None
    host, port = server.server_address[:2]
    print(
        f"digest-cleanup: serving metrics on http://{host!s}:{port}/metrics "
        f"({len(targets)} targets; run state read from Redis on every scrape)",
        file=sys.stderr,
        flush=True,
    )
    try:
        thread.join()  # the server runs until the process is stopped (SIGTERM or Ctrl-C)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _log_to_stderr(ctx: Context) -> None:
    """Send the collector's warnings (Redis unreachable) to stderr, scrubbed like a worker's."""
    from digest_cleanup.logs import install, item_prefixes

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("digest_cleanup")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    install(root, ctx.settings, item_prefixes(ctx.runtime.targets))
