"""A small W3C WebDriver client for headless Chromium, over plain HTTP.

The browser tests (Flower's tasks page, the console) and ``make screenshot`` need a
real browser, but only a dozen WebDriver calls: open a page, send basic auth, find and
click an element, read text, take a screenshot.  Selenium would be a dependency for
that; chromedriver's HTTP API is a few JSON requests, so this module speaks it with the
standard library and adds nothing to install beyond Debian's ``chromium`` and
``chromium-driver``.

:func:`chromium` is the way in: it starts chromedriver on a free port, opens a session
with a throwaway profile, and always ends both, so a failed assertion never leaves a
browser running into the next test.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from http.client import HTTPConnection
from pathlib import Path
from typing import Any, Final

from digest_cleanup.demo.servers import LOOPBACK, free_port
from tests.rig.stack import Process, Stack, wait_for
from tests.rig.tools import require_tool

__all__ = [
    "CHROMIUM_ARGS",
    "Session",
    "WebDriver",
    "WebDriverError",
    "basic_auth",
    "chromium",
]

#: The W3C key under which an element reference travels.
ELEMENT: Final = "element-6066-11e4-a52e-4f735466cecf"

#: Chromium's flags for a test machine: headless, as root, and with no outside network.
CHROMIUM_ARGS: Final[Sequence[str]] = (
    "--headless=new",
    # Tests run as root, where Chromium's sandbox cannot start.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # The machine has no outside network: nothing may try to reach it.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)

#: How long chromedriver may take to answer ``/status``.
START_TIMEOUT: Final = 30.0


class WebDriverError(AssertionError):
    """A WebDriver call that did not return 200; ``error`` is the W3C error code.

    An AssertionError, so a test that fails on one reads as a failed expectation
    with the driver's own message, not as a crash in the client.
    """

    def __init__(self, method: str, path: str, status: int, error: str, message: str) -> None:
        super().__init__(f"{method} {path}: {status} {error}: {message[:1000]}")
        self.status = status
        self.error = error


def basic_auth(credentials: str) -> str:
    """The ``Authorization`` header value for ``user:password``."""
    return "Basic " + base64.b64encode(credentials.encode()).decode()


class WebDriver:
    """chromedriver's HTTP API on the loopback."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One WebDriver command; returns its ``value`` or raises :class:`WebDriverError`."""
        data = None if body is None else json.dumps(body).encode()
        connection = HTTPConnection(LOOPBACK, self.port, timeout=60)
        try:
            connection.request(
                method, path, body=data, headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            status, text = response.status, response.read().decode()
        finally:
            connection.close()
        try:
            value = json.loads(text)["value"]
        except (ValueError, KeyError, TypeError):
            raise WebDriverError(method, path, status, "invalid response", text) from None
        if status != 200:
            error = value.get("error", "") if isinstance(value, dict) else ""
            message = value.get("message", text) if isinstance(value, dict) else text
            raise WebDriverError(method, path, status, error, message)
        return value

    def ready(self) -> bool:
        """Whether chromedriver answers and can open a session."""
        try:
            return bool(self.call("GET", "/status")["ready"])
        except OSError:
            return False

    def new_session(
        self, binary: str, profile: Path, *, window: tuple[int, int] = (1600, 820)
    ) -> Session:
        """Open a headless Chromium session with its own profile directory."""
        args = [
            *CHROMIUM_ARGS,
            f"--user-data-dir={profile}",
            f"--window-size={window[0]},{window[1]}",
        ]
        options = {"binary": binary, "args": args}
        capabilities = {"browserName": "chrome", "goog:chromeOptions": options}
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        return Session(self, str(value["sessionId"]))


class Session:
    """One browser session: navigation, elements, scripts, cookies and screenshots."""

    def __init__(self, driver: WebDriver, session_id: str) -> None:
        self.driver = driver
        self.session_id = session_id
        self.base = f"/session/{session_id}"

    def get(self, path: str) -> Any:
        return self.driver.call("GET", f"{self.base}/{path}")

    def post(self, path: str, body: Any) -> Any:
        return self.driver.call("POST", f"{self.base}/{path}", body)

    def cdp(self, command: str, params: Mapping[str, Any]) -> Any:
        """A Chrome DevTools Protocol command, for what WebDriver has no call for."""
        return self.post("goog/cdp/execute", {"cmd": command, "params": dict(params)})

    def headers(self, headers: Mapping[str, str]) -> None:
        """Send ``headers`` with every request the page makes from now on (replacing any).

        This is how a test sends basic auth: the browser would otherwise show its
        credentials prompt, which WebDriver cannot fill in.
        """
        self.cdp("Network.enable", {})
        self.cdp("Network.setExtraHTTPHeaders", {"headers": dict(headers)})

    def authenticate(self, credentials: str) -> None:
        """Send HTTP basic auth for ``user:password`` with every request from now on."""
        self.headers({"Authorization": basic_auth(credentials)})

    def open(self, url: str) -> None:
        """Navigate to ``url``; returns once the page has loaded."""
        self.post("url", {"url": url})

    @property
    def url(self) -> str:
        return str(self.get("url"))

    def script(self, source: str, *args: Any) -> Any:
        """Run ``source`` as a function body in the page; ``arguments[i]`` are ``args``."""
        return self.post("execute/sync", {"script": source, "args": list(args)})

    def find_all(self, css: str) -> list[str]:
        """The element references matching ``css`` (none is an empty list, not an error)."""
        found = self.post("elements", {"using": "css selector", "value": css})
        return [str(element[ELEMENT]) for element in found]

    def find(self, css: str) -> str:
        """The one element matching ``css``; fails if there is none or more than one."""
        found = self.find_all(css)
        assert len(found) == 1, f"{len(found)} elements match {css!r} on {self.url}"
        return found[0]

    def click(self, css: str) -> None:
        """A real click on the one element matching ``css``, as a user makes it."""
        self.post(f"element/{self.find(css)}/click", {})

    def texts(self, css: str) -> list[str]:
        """The rendered text (``innerText``, trimmed) of every element matching ``css``."""
        source = (
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".map(function (e) { return e.innerText.trim(); });"
        )
        return [str(text) for text in self.script(source, css)]

    def text(self, css: str) -> str:
        """The rendered text of the one element matching ``css``."""
        self.find(css)
        (text,) = self.texts(css)
        return text

    def attributes(self, css: str, name: str) -> list[str | None]:
        """Attribute ``name`` of every element matching ``css`` (None where it is absent)."""
        # The map callback has its own ``arguments``: the name reaches it through a variable.
        source = (
            "var name = arguments[1];"
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".map(function (e) { return e.getAttribute(name); });"
        )
        return [None if v is None else str(v) for v in self.script(source, css, name)]

    def wait_for_element(self, css: str, timeout: float = 30.0) -> str:
        """Poll until exactly one element matches ``css``: a page a click leads to has loaded."""
        found: list[str] = wait_for(
            lambda: len(f := self.find_all(css)) == 1 and f, timeout, f"{css!r} to appear"
        )
        return found[0]

    def cookie(self, name: str) -> str:
        """The value of the page's cookie ``name``."""
        return str(self.get(f"cookie/{name}")["value"])

    def screenshot(self) -> bytes:
        """A PNG of the viewport."""
        return base64.b64decode(self.get("screenshot"))

    def full_screenshot(self) -> bytes:
        """A PNG of the whole page, below the fold too (the viewport's width)."""
        shot = self.cdp("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        """End the session, which quits its browser."""
        self.driver.call("DELETE", self.base)


@contextlib.contextmanager
def chromium(
    workdir: Path,
    *,
    stack: Stack | None = None,
    window: tuple[int, int] = (1600, 820),
) -> Iterator[Session]:
    """A headless Chromium session driven by a chromedriver of its own; both end on exit.

    chromedriver starts on a free port, as one of ``stack``'s processes when given (so
    its log sits with the others and ``stack.stop`` ends it too), else on its own with a
    log in ``workdir``.  The profile is a fresh directory in ``workdir``.  A missing
    ``chromium`` or ``chromedriver`` skips the test, and fails it under ``CI=true``.
    """
    binary = require_tool("chromium")
    chromedriver = require_tool("chromedriver")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [chromedriver, f"--port={port}"]
    if stack is not None:
        process = stack.start("chromedriver", argv)
    else:
        process = Process("chromedriver", argv, os.environ, workdir / "chromedriver.log")
    try:
        driver = WebDriver(port)

        def ready() -> bool:
            if not process.alive():
                raise RuntimeError(f"chromedriver exited:\n{process.output()[-3000:]}")
            return driver.ready()

        wait_for(ready, START_TIMEOUT, "chromedriver to start")
        profile = workdir / f"chromium-profile-{port}"
        session = driver.new_session(binary, profile, window=window)
        try:
            yield session
        finally:
            with contextlib.suppress(OSError, WebDriverError):
                session.close()
    finally:
        process.stop()
