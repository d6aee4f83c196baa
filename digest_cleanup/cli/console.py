"""``digest-cleanup console``: serve the operations console (runs and dead letters).

It refuses to start without ``CLEANUP_CONSOLE_AUTH`` (the console never runs
open), and binds to loopback unless ``--host`` says otherwise: put it behind
the same reverse proxy or SSH tunnel as Flower.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import TYPE_CHECKING

from digest_cleanup.cli.context import EXIT_OK, add_command, print_json

if TYPE_CHECKING:
    from digest_cleanup.cli.context import Context, Subcommands
    from digest_cleanup.console.auth import Users

#: Loopback unless told otherwise: the console can redrive and purge.
DEFAULT_HOST = "127.0.0.1"
#: The console's port when ``--port`` is not given (Flower's is 5555).
DEFAULT_PORT = 8642


def register(subcommands: Subcommands) -> None:
    """Add ``console``."""
    p = add_command(
        subcommands,
        "console",
        console_command,
        "serve the operations console: runs and dead letters",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks one)"
    )


def console_command(args: argparse.Namespace, ctx: Context) -> int:
    """Serve until interrupted; print one line with the URL once listening."""
    from digest_cleanup.console.auth import Users

    users = Users.from_settings(ctx.settings)  # no admin: exit 2, saying how to set one
    ctx.ping()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args, ctx, users))
    return EXIT_OK


async def _serve(args: argparse.Namespace, ctx: Context, users: Users) -> None:
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from digest_cleanup.console.app import make_app

    sockets = bind_sockets(args.port, address=args.host)
    server = HTTPServer(make_app(ctx.runtime, users), xheaders=False)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{port}/"
    if args.json:
        print_json({"url": url, "host": args.host, "port": port})
    else:
        print(f"console listening on {url}")
    sys.stdout.flush()
    stop = asyncio.Event()
    # SIGTERM (systemd, supervisord, compose) ends it cleanly, as Ctrl-C does.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.stop()
