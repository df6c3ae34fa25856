"""Delivering from the outbox: webhooks and commands, retried with backoff until a deadline.

:class:`Sender` runs in its own thread in ``dispatch serve`` (:meth:`Sender.run`), so a slow or
dead receiver costs the dispatcher nothing but this thread. Each :meth:`Sender.tick` claims due
deliveries, attempts each one and records the result. Every delivery carries the message's
stable id (header ``Dispatch-Message-Id`` and field ``id``): a receiver drops duplicates by it,
since a crash between "received" and "recorded" means a second delivery (at least once).

Signing (``secret_file``): header ``Dispatch-Timestamp`` is the epoch second of the attempt and
``Dispatch-Signature`` is ``sha256=`` + hex HMAC-SHA256 over ``"{timestamp}.{body}"`` keyed with
the file's content (surrounding whitespace stripped).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import os
import random
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.notify.opener import open_within
from dispatcher.notify.settings import (
    Channel,
    NotifySettings,
    Webhook,
    WebhookFormat,
    redacted_url,
)
from dispatcher.notify.store import Delivery, NotifyStore
from scope.foundation.errors import ConfigError

__all__ = [
    "Answer",
    "Sender",
    "backoff",
    "deliver",
    "load_secret",
    "load_secrets",
    "secret_errors",
    "sign",
    "slack_text",
]

log = logging.getLogger("dispatch.notify")

RESPONSE_CAP = 64 * 1024
"""Bytes of a receiver's answer read (and kept for ``notify test``) at most."""


def backoff(attempts: int, *, base: float, cap: float, jitter: float) -> float:
    """Seconds before the next try after ``attempts`` failed ones: doubling from ``base`` up
    to ``cap``, scaled by ``jitter`` in [0, 1) to between half and all of it (so many
    messages failing together do not retry together)."""
    delay = min(cap, base * (2 ** max(attempts - 1, 0)))
    return delay * (0.5 + jitter / 2)


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Dispatch-Signature`` header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def load_secret(
    path_text: str,
    *,
    key: str = "notify.channels.webhook.secret_file",
    source: str | os.PathLike[str] | None = None,
) -> bytes:
    """A channel's signing secret; refused (one line naming the config file ``source``, the
    ``key`` and the fix) unless the file is ours and private."""
    path = Path(path_text).expanduser()
    where = None if source is None else str(source)
    try:
        info = path.stat()
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(
            f"secret file {path} cannot be read ({err.strerror})",
            key=key,
            path=where,
            remedy="create it with mode 0600",
        ) from None
    if stat.S_IMODE(info.st_mode) & 0o077 or info.st_uid != os.getuid():
        raise ConfigError(
            f"secret file {path} is readable by others (mode {stat.S_IMODE(info.st_mode):o})",
            key=key,
            path=where,
            remedy=f"chmod 600 {path}",
        )
    return data.strip()


def load_secrets(
    settings: NotifySettings, source: str | os.PathLike[str] | None = None
) -> dict[str, bytes]:
    """Every signing channel's secret, by channel name (checked as :func:`load_secret`; the
    first refusal is raised)."""
    return {
        name: load_secret(hook.secret_file or "", key=_secret_key(name), source=source)
        for name, hook in _signing(settings)
    }


def secret_errors(
    settings: NotifySettings, source: str | os.PathLike[str] | None = None
) -> list[ConfigError]:
    """The refusal of every signing channel whose secret file serve would refuse (``dispatch
    config check`` reports them all)."""
    found = []
    for name, hook in _signing(settings):
        try:
            load_secret(hook.secret_file or "", key=_secret_key(name), source=source)
        except ConfigError as err:
            found.append(err)
    return found


def _signing(settings: NotifySettings) -> list[tuple[str, Webhook]]:
    return [
        (name, ch.webhook)
        for name, ch in settings.channels.items()
        if ch.webhook is not None and ch.webhook.secret_file
    ]


def _secret_key(channel: str) -> str:
    return f"notify.channels.{channel}.webhook.secret_file"


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What one attempt got: success, and the receiver's status and (capped) answer."""

    ok: bool
    detail: str


def _inert(text: str) -> str:
    """``text`` as Slack shows it literally: its three control characters escaped (so a
    title or an output line cannot make a link or ping a channel)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(message: Mapping[str, Any]) -> str:
    """The ``text`` of a ``format: slack`` body: the event and its subject, then the worker's
    output (already capped by ``notify.output_tail``) in a code block."""
    card = message.get("card") or {}
    job = message.get("job")
    if card:
        title, who = card.get("title"), card.get("assignee")
        text = f"{message['event']}: card {card.get('id')} {_inert(repr(title))} ({who})"
    else:
        text = f"{message['event']}: cron job {job}" if job else str(message["event"])
    output = message.get("output")
    if output:
        # A run of backticks in the output would close the block early.
        shown = _inert(str(output)).replace("```", "`\u200b``")
        cut = "(earlier output cut)\n" if message.get("output_cut") else ""
        text += f"\n{cut}```\n{shown.rstrip(chr(10))}\n```"
    return text


def _post(channel: Channel, body: str, secret: bytes | None) -> Answer:
    assert channel.webhook is not None
    hook = channel.webhook
    message = json.loads(body)
    payload = body.encode()
    if hook.format is WebhookFormat.SLACK:
        payload = json.dumps({"text": slack_text(message)}).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "dispatch-notify",
        "Dispatch-Message-Id": str(message["id"]),
        "Dispatch-Event": str(message["event"]),
    }
    if secret is not None:
        stamp = int(time.time())
        headers["Dispatch-Timestamp"] = str(stamp)
        headers["Dispatch-Signature"] = sign(secret, stamp, payload)
    # The URL's scheme was checked (http or https) when the config was read.
    request = urllib.request.Request(hook.url, data=payload, headers=headers, method="POST")  # noqa: S310
    where = redacted_url(hook.url)
    started = time.monotonic()
    try:
        with open_within(request, hook.timeout) as response:
            text = response.read(RESPONSE_CAP).decode(errors="replace")
            return Answer(ok=200 <= response.status < 300, detail=f"{response.status} {text}")
    except urllib.error.HTTPError as err:
        return Answer(ok=False, detail=f"{where}: HTTP {err.code}")
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        if time.monotonic() - started >= hook.timeout:
            return Answer(ok=False, detail=f"{where}: timed out after {hook.timeout:g}s")
        reason = getattr(err, "reason", err)
        return Answer(ok=False, detail=f"{where}: {reason}")


def _run(channel: Channel, body: str) -> Answer:
    argv = channel.argv()
    try:
        # Its own process group: a timeout ends everything it started (a shell's pipeline
        # too), not only the first process, whose children would hold the pipes open.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        return Answer(ok=False, detail=f"cannot run {argv[0]}: {err.strerror}")
    try:
        out, _ = proc.communicate(body.encode(), timeout=channel.timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc)
        return Answer(ok=False, detail=f"timed out after {channel.timeout:g}s")
    text = out[:RESPONSE_CAP].decode(errors="replace")
    return Answer(ok=proc.returncode == 0, detail=f"exit {proc.returncode} {text}".rstrip())


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the group of a command channel's process that outlived its timeout, then reap
    it. The group is surely its own: the leader is our child and not reaped yet, so its id
    cannot have been reused. Something that left the group and still holds a pipe is not
    waited for beyond a second."""
    if proc.returncode is None:  # else reaped: its id is no longer a proof of identity
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


def deliver(channel: Channel, body: str, secret: bytes | None = None) -> Answer:
    """One attempt to hand ``body`` (a message's JSON) to ``channel``."""
    if channel.webhook is not None:
        return _post(channel, body, secret)
    return _run(channel, body)


FRESH_MARGIN = 2.0
"""Seconds a woken look reaches back before the previous one (another process's clock, a
commit that took a while)."""


class Sender:
    """Delivers the outbox (see the module docstring); ``tick(now)`` is one step."""

    def __init__(
        self,
        store: NotifyStore,
        settings: NotifySettings,
        *,
        clock: Callable[[], float] = time.time,
        base: float = 2.0,
        cap: float = 600.0,
        poll: float = 0.5,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.base, self.cap, self.poll, self.rand = base, cap, poll, rand
        # Read (and checked) once at start: a bad secret file stops serve with one line.
        self.secrets = load_secrets(settings)
        self.stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def _lease(self) -> float:
        timeouts = [
            c.webhook.timeout if c.webhook else c.timeout for c in self.settings.channels.values()
        ]
        return 2 * max(timeouts, default=30.0) + 30.0

    def tick(self, now: float, *, created_since: float | None = None) -> int:
        """Claim and attempt what is due at ``now`` (only messages made since
        ``created_since`` when given); how many were delivered."""
        delivered = 0
        for item in self.store.claim(now=now, lease=self._lease(), created_since=created_since):
            delivered += self._attempt(item)
        return delivered

    def _attempt(self, item: Delivery) -> int:
        channel = self.settings.channels.get(item.channel)
        if channel is None:
            answer = Answer(ok=False, detail=f"channel {item.channel!r} is no longer configured")
        else:
            answer = deliver(channel, item.body, self.secrets.get(item.channel))
        now = self.clock()
        if answer.ok:
            self.store.settle(item, now=now, error=None, retry_at=None)
            return 1
        retry_at = now + backoff(
            item.attempts + 1, base=self.base, cap=self.cap, jitter=self.rand()
        )
        if retry_at - item.since > self.settings.deadline:
            log.warning(
                "notification %s to %s is dead: %s", item.message_id, item.channel, answer.detail
            )
            self.store.settle(item, now=now, error=answer.detail, retry_at=None)
        else:
            self.store.settle(item, now=now, error=answer.detail, retry_at=retry_at)
        return 0

    def run(self) -> None:
        """Tick until :attr:`stop` is set; an error in one tick is logged, not fatal."""
        # A wake-up (serve saw the board change) delivers only messages made since the last
        # look, at once; retries of older ones wait for the poll. So a backlog of undeliverable
        # messages is retried at the poll's pace, never in a burst beside every claim.
        next_full = time.monotonic()
        since: float | None = None
        while not self.stop.is_set():
            # Cleared before the tick: a wake-up during it makes the wait below return at once.
            self._wake.clear()
            now = self.clock()
            full = time.monotonic() >= next_full
            try:
                self.tick(now, created_since=None if full or since is None else since)
            except Exception as err:
                log.warning("notification sender: %s", err)
            since = now - FRESH_MARGIN
            if full:
                next_full = time.monotonic() + self.poll
            self._wake.wait(max(0.0, next_full - time.monotonic()))

    def wake(self) -> None:
        """Look at the outbox now (serve saw the board change: a message may be queued)."""
        self._wake.set()

    def start(self) -> None:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="dispatch-notify", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (a delivery in flight finishes or times out first)."""
        self.stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
