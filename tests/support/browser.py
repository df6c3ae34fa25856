"""A real ``dispatch web`` process and a real headless Chromium for the browser tier.

:class:`WebProcess` starts this checkout's ``dispatch web`` on a free loopback port (``--listen
127.0.0.1:0``) and reads the address and sign-in link it prints; :meth:`WebProcess.stop` sends
SIGTERM and returns the exit status.

``browser`` (session scope) is Debian's Chromium (``/usr/bin/chromium``, or
``DISPATCH_CHROMIUM``) driven by Playwright for Python, launched once per test session with
the flags a root, offline machine needs; each test opens its own context (``page`` fixture),
so cookies never leak between tests. Playwright's own browser download (``playwright
install``) is never used: it needs the internet. Without Chromium or Playwright the tests skip
with the reason; ``DISPATCH_REQUIRE_BROWSER=1`` (CI) turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import re
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import dispatch_argv, run_dispatch
from tests.support.env import no_bus_env
from tests.support.procs import stop_child

ENV_REQUIRE = "DISPATCH_REQUIRE_BROWSER"
CHROMIUM = os.environ.get("DISPATCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A name that resolves to the dashboard, as a DNS-rebinding attack would make it.
    "--host-resolver-rules=MAP rebound.test 127.0.0.1",
)
_SERVING = re.compile(r"dispatch web: serving .* on (http://\S+?)/?$")
_SIGN_IN = re.compile(r"dispatch web: sign in: (http://\S+)$")


def require_browser() -> bool:
    """Whether a missing browser must fail the run (``DISPATCH_REQUIRE_BROWSER=1``)."""
    return os.environ.get(ENV_REQUIRE, "") == "1"


class WebProcess:
    """``dispatch web`` on a state dir, as a child process (see the module docstring)."""

    def __init__(
        self,
        config: Path,
        state: Path,
        env: Mapping[str, str],
        *args: str,
        listen: str = "127.0.0.1:0",
        timeout: float = 60.0,
        program: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        argv = dispatch_argv(config, state, "web", "--listen", listen, *args)
        if program is not None:
            # Another installation of dispatch (the install tier's venv) instead of this
            # checkout's: the same arguments after its program.
            argv = [*program, *argv[3:]]
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.errors: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()
        self.url, self.sign_in = self._wait_for_address(timeout)

    def _pump(self, stream: Any, stdout: bool) -> None:
        for line in stream:
            (self.output if stdout else self.errors).append(line.rstrip("\n"))
            if stdout:
                self._lines.put(line.rstrip("\n"))
        if stdout:
            self._lines.put(None)

    def _wait_for_address(self, timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        url = sign_in = None
        while sign_in is None:
            remaining = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(0.01, remaining))
            except queue.Empty:
                line = ""
            if line is None or remaining <= 0:
                self.stop()
                raise AssertionError(
                    f"dispatch web did not start: stdout {self.output!r}, stderr {self.errors!r}"
                )
            serving = _SERVING.match(line)
            if serving:
                url = serving.group(1)
            link = _SIGN_IN.match(line)
            if link:
                sign_in = link.group(1)
        assert url is not None
        return url, sign_in

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then its exit status (SIGKILL after ``timeout``)."""
        return stop_child(self.proc, grace=timeout)


class SseReader:
    """Reads one Server-Sent Events stream in a thread; :meth:`next` returns its events. It
    takes gzip as a browser does, so a stream that got compressed (and held back in the
    compressor) shows as a ``content-encoding`` header and as late events."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        asked = {"Accept-Encoding": "gzip, deflate, br", **(headers or {})}
        self.conn.request("GET", path, headers=asked)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {name.lower(): value for name, value in self.response.getheaders()}
        self.events: queue.Queue[dict[str, str]] = queue.Queue()
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event: dict[str, str] = {}
        try:
            for raw in self.response:
                line = raw.decode("utf-8").rstrip("\n")
                if not line:
                    if "data" in event:
                        self.events.put(event)
                    event = {}
                elif line.startswith(":"):
                    continue
                else:
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    event[name] = event[name] + "\n" + value if name in event else value
        except (OSError, ValueError, AttributeError):
            pass  # closed by close() while reading

    def next(self, kind: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """The next event (of ``kind``): its ``event``, ``id`` and parsed ``data``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {kind or 'SSE'} event within {timeout:g} s")
            try:
                event = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if kind is None or event.get("event") == kind:
                return {**event, "data": json.loads(event["data"])}

    def close(self) -> None:
        """Drop the connection (the reading thread ends at once)."""
        sock = self.conn.sock
        if sock is not None:
            # A reader blocked in readline() holds the response's lock until data comes (the
            # next keep-alive may be 15 s away): shutting the socket down wakes it first.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.response.close()
        self.conn.close()


class WebHome:
    """A config, a state dir and an environment without systemd; the CLI and dashboards on
    them."""

    def __init__(self, root: Path, config: str) -> None:
        self.root = root
        self.config = root / "config.yaml"
        self.config.write_text(config)
        self.state = root / "state"
        self.env = no_bus_env(root)

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``dispatch ARGS`` on this home (a failure fails the test unless ``check=False``)."""
        return run_dispatch(self.config, self.state, self.env, *args, check=check)

    def json(self, *args: str) -> Any:
        """``dispatch ARGS --json``, parsed."""
        return json.loads(self.dispatch(*args, "--json").stdout)

    def add(self, title: str, assignee: str = "echo") -> str:
        """``dispatch kanban add``; the card's id."""
        return self.dispatch("kanban", "add", title, "--assignee", assignee).stdout.strip()

    def workspace(self) -> Any:
        """A board workspace opened as ``dispatch kanban add`` opens one."""
        from dispatcher.app.workspace import Workspace
        from dispatcher.config import load_config

        settings = load_config(self.config).settings
        return Workspace(settings, self.state, environ=self.env, config_path=self.config)

    def add_fast(self, title: str) -> tuple[str, float]:
        """Add a card the way the CLI does, in this process: its id and the commit's time."""
        workspace = self.workspace()
        try:
            card, _ = workspace.board.add(title, assignee="echo", now=workspace.now())
            return card.id, time.monotonic()
        finally:
            workspace.close()


def run_web(
    config: Path, state: Path, env: Mapping[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``dispatch web ARGS`` run to its end (for the start-up errors)."""
    return subprocess.run(
        dispatch_argv(config, state, "web", *args),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _unavailable(reason: str) -> None:
    if require_browser():
        pytest.fail(f"{ENV_REQUIRE}=1 but no browser: {reason}", pytrace=False)
    pytest.skip(f"no browser: {reason}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright, once per test module (see the module docstring).

    Not per session: Playwright's sync API keeps an asyncio loop running in the main thread
    while it is started, so a later module's ``asyncio.run`` would find a loop running."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        _unavailable(f"Playwright for Python is not installed ({exc})")
    manager = sync_playwright().start()
    try:
        try:
            # Playwright gives the browser a fresh temporary profile of its own.
            launched = manager.chromium.launch(
                executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), timeout=60_000
            )
        except Error as exc:
            _unavailable(f"Chromium did not start: {str(exc).splitlines()[0]}")
        try:
            yield launched
        finally:
            launched.close()
    finally:
        manager.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context and page for one test (1280 x 900)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def dialogs_of(target: Any) -> Sequence[str]:
    """Record (and dismiss) every dialog the page opens; returns the live list of messages."""
    seen: list[str] = []

    def record(dialog: Any) -> None:
        seen.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    target.on("dialog", record)
    return seen
