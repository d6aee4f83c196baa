"""``--keep``: the demo's stack left up, with Flower, until Ctrl-C."""

from __future__ import annotations

import contextlib
import secrets
import signal
import urllib.request

from digest_cleanup.demo.artifacts import TARGET
from digest_cleanup.demo.phases import say
from digest_cleanup.demo.servers import LOOPBACK, free_port
from digest_cleanup.demo.stack import Stack, wait_for

#: Seconds a started Flower may take to answer its health check.
FLOWER_READY_TIMEOUT = 60.0


def keep_up(stack: Stack, s3_endpoint_url: str, bucket: str) -> None:
    """Start Flower, say how to reach the stack and use the CLI on it, and wait for Ctrl-C."""
    url, auth = _start_flower(stack)
    say()
    say(f"Flower      {url}   (user {auth.split(':')[0]}, password {auth.split(':', 1)[1]})")
    say(f"S3          {s3_endpoint_url}   (any key pair; bucket {bucket})")
    say("To use the CLI against this stack:")
    for name in ("CLEANUP_BROKER_URL", "CLEANUP_S3_ENDPOINT_URL", "CLEANUP_TARGETS_FILE"):
        say(f"  export {name}={stack.env[name]}")
    say("  export AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo AWS_REGION=us-east-1")
    say(f"  digest-cleanup runs; digest-cleanup verify {TARGET}")
    say("The stack stays up until Ctrl-C.")
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            signal.pause()


def _start_flower(stack: Stack) -> tuple[str, str]:
    """Start Flower with fresh basic-auth credentials; its URL and ``user:password`` once up."""
    port = free_port()
    # One user:pass without a comma: Flower splits the value on commas.
    auth = f"demo:{secrets.token_urlsafe(12)}"
    stack.start(
        "flower",
        [
            stack.executable("celery"),
            "-A",
            "digest_cleanup",
            "flower",
            f"--address={LOOPBACK}",
            f"--port={port}",
        ],
        # Flower reads FLOWER_BASIC_AUTH itself, so the password stays out of argv.
        env={"FLOWER_BASIC_AUTH": auth},
    )
    url = f"http://{LOOPBACK}:{port}"
    wait_for(lambda: _answers(f"{url}/healthcheck"), FLOWER_READY_TIMEOUT, "Flower to answer")
    return url, auth


def _answers(url: str) -> bool:
    """Whether ``url`` answers 200 within two seconds."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback http
            return bool(response.status == 200)
    except OSError:  # URLError and timeouts included
        return False
