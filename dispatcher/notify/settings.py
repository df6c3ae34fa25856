"""The ``notify:`` section of config.yaml: channels (a webhook or a command) and the rules that
route events to them.

Secrets stay out of ``dispatch config show`` and of every log line: a webhook URL is shown with
its path and query replaced (Slack-style URLs carry their token in the path), and a secret file
is named by its path only, never read here.
"""

from __future__ import annotations

import enum
import urllib.parse
from dataclasses import dataclass
from typing import Any

from dispatcher.launch.outbox import EVENTS, OUTPUT_TAIL, Route
from scope.foundation.schema import (
    Argv,
    Bool,
    Choice,
    Duration,
    Invalid,
    Kind,
    ListOf,
    MapOf,
    Optional,
    Record,
    Size,
    Str,
    setting,
)

__all__ = ["Channel", "NotifySettings", "Rule", "Webhook", "WebhookFormat", "redacted_url"]

CHANNEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"

MAX_OUTPUT_TAIL = 16 * 1024
"""The most output a message may carry (a Slack message's text stays well inside its limit)."""


class WebhookFormat(enum.StrEnum):
    """The body a webhook receives."""

    JSON = "json"
    """The message itself (docs/notify.md)."""
    SLACK = "slack"
    """``{"text": ...}``, what a Slack-compatible incoming webhook accepts."""


def redacted_url(url: str) -> str:
    """``url`` with its credentials, path and query hidden: safe for logs and ``config show``."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    hidden = "/<redacted>" if (parts.path.strip("/") or parts.query) else ""
    return f"{parts.scheme}://{host}{hidden}"


class WebhookUrl(Kind):
    """An ``http`` or ``https`` URL with a host; dumped redacted (its path may be a token)."""

    label = "http(s) URL"

    def convert(self, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            raise Invalid("expected an http(s) URL")
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # Never echo the value: it may carry the channel's token.
            raise Invalid(
                f"not an http(s) URL with a host (scheme {parts.scheme or 'missing'!r}); "
                "use https://host/path"
            )
        return value

    def dump(self, value: Any) -> Any:
        return redacted_url(value)


@dataclass(frozen=True, kw_only=True)
class Webhook:
    """``notify.channels.<name>.webhook``: an HTTP POST of each message."""

    url: str = setting(kind=WebhookUrl(), doc="Where to POST (http or https; no redirects).")
    format: WebhookFormat = setting(
        WebhookFormat.JSON,
        kind=Choice(WebhookFormat),
        doc='Body: json (the message) or slack ({"text": ...}).',
    )
    secret_file: str | None = setting(
        None,
        kind=Optional(Str()),
        doc="File (mode 0600) whose content signs each delivery with HMAC-SHA256.",
    )
    timeout: float = setting(
        10.0, kind=Duration(min=1), doc="Bound on connecting and on the whole delivery."
    )


@dataclass(frozen=True, kw_only=True)
class Channel:
    """``notify.channels.<name>``: exactly one of ``webhook`` and ``command``."""

    webhook: Webhook | None = setting(
        None, kind=Optional(Record(Webhook)), doc="Deliver by HTTP POST."
    )
    command: tuple[str, ...] | str | None = setting(
        None,
        kind=Optional(Argv()),
        doc="Deliver by running this argv (no shell; a string only with shell: true) with"
        " the message's JSON on stdin.",
    )
    shell: bool = setting(
        False, kind=Bool(), doc="Command channels: run a string command through /bin/sh -c."
    )
    timeout: float = setting(
        30.0, kind=Duration(min=1), doc="Command channels: kill the command after this long."
    )

    def check(self) -> None:
        """One way of delivering, and a command is an argv list unless a shell was asked for."""
        if (self.webhook is None) == (self.command is None):
            raise Invalid("a channel needs exactly one of 'webhook' and 'command'")
        if isinstance(self.command, str) and not self.shell:
            raise Invalid(
                "a command channel takes an argv list (no shell); write it as a list"
                ' (e.g. ["notify-me", "--quiet"]) or set shell: true',
                ("command",),
            )

    def argv(self) -> list[str]:
        """What a command channel runs: its argv, or ``/bin/sh -c`` with its string."""
        assert self.command is not None
        if isinstance(self.command, str):
            return ["/bin/sh", "-c", self.command]
        return list(self.command)


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One entry of ``notify.rules``: these events (narrowed by the filters) go to these
    channels."""

    on: tuple[str, ...] = setting(kind=ListOf(Str()), doc="Event names (docs/notify.md).")
    to: tuple[str, ...] = setting(kind=ListOf(Str()), doc="Channel names.")
    assignees: tuple[str, ...] = setting(
        (), kind=ListOf(Str()), doc="Only cards of these assignees (default: any)."
    )
    jobs: tuple[str, ...] = setting(
        (), kind=ListOf(Str()), doc="Only these cron jobs (default: any)."
    )
    groups: tuple[str, ...] = setting(
        (),
        kind=ListOf(Str()),
        doc="Only cards of these groups (kanban add --group; default: any).",
    )

    def check(self) -> None:
        """Known event names, at least one of each."""
        if not self.on:
            raise Invalid("a rule needs at least one event", ("on",))
        if not self.to:
            raise Invalid("a rule needs at least one channel", ("to",))
        for index, event in enumerate(self.on):
            if event not in EVENTS:
                raise Invalid(
                    f"unknown event {event!r}; use one of: {', '.join(EVENTS)}", ("on", index)
                )

    def route(self) -> Route:
        """The rule as the outbox routes it."""
        return Route(
            events=frozenset(self.on),
            channels=self.to,
            assignees=frozenset(self.assignees),
            jobs=frozenset(self.jobs),
            groups=frozenset(self.groups),
        )


class RuleRecord(Record):
    """A rule's record, reading the YAML 1.1 boolean ``on`` (what ``on:`` parses to) as the
    key ``on``."""

    def prepared(self, value: Any) -> Any:
        if isinstance(value, dict) and True in value:
            value = {("on" if key is True else key): item for key, item in value.items()}
        return value


@dataclass(frozen=True, kw_only=True)
class NotifySettings:
    """The ``notify:`` section."""

    channels: dict[str, Channel] = setting(
        default_factory=dict,
        kind=MapOf(Record(Channel), CHANNEL_PATTERN, "letters, digits, '_', '.', '-'"),
        doc="Named ways of delivering a message.",
    )
    rules: tuple[Rule, ...] = setting(
        (), kind=ListOf(RuleRecord(Rule)), doc="Which events go to which channels."
    )
    deadline: float = setting(
        86400.0,
        kind=Duration(min=1),
        doc="Give up retrying a message after this long (it is then dead).",
    )
    output_tail: int = setting(
        OUTPUT_TAIL,
        kind=Size(min=0, max=MAX_OUTPUT_TAIL),
        doc="Bytes of a worker's last output (hooks and redaction applied) carried by the"
        " message of a run's or fire's end, at most 16KiB; 0: none.",
    )

    def check(self) -> None:
        """Every channel a rule names is defined."""
        for index, rule in enumerate(self.rules):
            for position, name in enumerate(rule.to):
                if name not in self.channels:
                    raise Invalid(
                        f"unknown channel {name!r}; define it under notify.channels",
                        ("rules", index, "to", position),
                    )

    def routes(self) -> list[Route]:
        """Every rule as the outbox routes it."""
        return [rule.route() for rule in self.rules]
